"""A reset, decided once: what every member of a new world does to end up holding one state.

Every member contributes what it knows to one all-reduce (:func:`gather_counts`); each then derives the same
:class:`ResetPlan` from the same numbers (:func:`plan_reset`), so no member can take a branch that leaves
another waiting in a collective. State sync and the built-in handlers read their decisions from the plan.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from elastrain.executor._private.elastic.worker.faults import fault_point


class SyncRole(enum.Enum):
    """This rank's part in moving the state."""

    SOURCE = "source"  # sends its live state; every member ends up holding it
    RECEIVER_KEEPS_COMMITTED = "receiver_keeps_committed"  # receives into its live state only
    RECEIVER_FRESH_COMMITTED = "receiver_fresh_committed"  # receives, and stages a new committed copy
    LOAD_PERSISTED = "load_persisted"  # every member loads the latest persisted state instead


class StateLoss(enum.Enum):
    """What a world does when no member holds commits although the job made some (its high-water mark)."""

    NONE = "none"  # someone holds the newest commits, or the job never committed
    RESUME_PERSISTED = "resume_persisted"  # loads the latest persisted state (maybe older than the mark)
    START_OVER = "start_over"  # the user opted in: start over from the initial state
    FAIL = "fail"  # raise ElasticJobError on every member


class SyncProgress:
    """Counts the units a sync moved (what the ``sync_mid`` fault point counts), across handlers."""

    def __init__(self) -> None:
        self.done = 0

    def unit_done(self) -> None:
        self.done += 1
        fault_point("sync_mid", done=self.done)


@dataclass(frozen=True)
class Counts:
    """What the one all-reduce of a reset tells every member."""

    commits: tuple[int, ...]  # per rank
    at_commit: tuple[bool, ...]  # per rank: its live state is its last commit
    all_ask_to_skip: bool  # every rank's reset came from a removals-only interrupt
    all_persist: bool  # every rank has persistence
    high_water: int  # the most commits the job is known to have reached (the members' view, maxed)


@dataclass(frozen=True)
class ResetPlan:
    """One member's view of a reset; every member's plan agrees on everything but ``rank`` and ``role``.

    ``keeps_committed``: this rank's committed copy already is what the sync leaves (it is at its last commit,
    with the source's count, and so is the source): it copies nothing into it. Otherwise a sync stages a fresh
    committed copy and swaps it in only once the whole sync succeeded, so a sync that fails partway leaves every
    member's committed copy, and its commit count, as they were.
    """

    generation: int
    rank: int
    source: int
    best: int  # commits the source holds: every member's count once the sync succeeded
    skip_sync: bool  # every member kept the same state: only what depends on the world is synced
    role: SyncRole
    keeps_committed: bool
    run_callbacks: bool  # the reset callbacks run before the state moves (after it, when persisted state loads)
    high_water: int = 0
    loss: StateLoss = StateLoss.NONE
    progress: SyncProgress = field(default_factory=SyncProgress, compare=False, repr=False)

    @classmethod
    def standalone(cls, source: int, rank: int) -> ResetPlan:
        """A sync outside a reset (a handler's ``sync(source)`` called directly): receive and commit fresh."""
        role = SyncRole.SOURCE if rank == source else SyncRole.RECEIVER_FRESH_COMMITTED
        return cls(0, rank, source, 0, False, role, False, False)

    def without_persisted(self, start_over_on_state_loss: bool) -> ResetPlan:
        """The plan once persistence turned out to hold nothing: a sync from the source after all (of a state
        lost if the job had committed before)."""
        role = SyncRole.SOURCE if self.rank == self.source else SyncRole.RECEIVER_FRESH_COMMITTED
        loss = _loss(self.high_water > 0, start_over_on_state_loss)
        return ResetPlan(
            self.generation, self.rank, self.source, self.best, False, role, False, self.generation > 1,
            self.high_water, loss,
        )  # fmt: skip


def gather_counts(
    commits: int, skip_sync: bool, at_commit: bool, persists: bool, high_water: int
) -> tuple[int, Counts]:
    """This rank and what every member of its world contributed (one all-reduce)."""
    import torch
    import torch.distributed as dist

    from elastrain.executor._private.elastic.worker.collectives import collective_device

    size, rank = dist.get_world_size(), dist.get_rank()
    # [commits per rank | at_commit per rank | ranks asking to skip | ranks persisting | high-water mark per rank]
    # One slot per rank wherever a maximum or a per-rank value is needed: one SUM serves them all.
    values = torch.zeros(3 * size + 2, dtype=torch.int64, device=collective_device())
    values[rank] = commits
    values[size + rank] = int(at_commit)
    values[2 * size] = int(skip_sync)
    values[2 * size + 1] = int(persists)
    values[2 * size + 2 + rank] = high_water
    dist.all_reduce(values)
    return rank, Counts(
        commits=tuple(int(v) for v in values[:size].tolist()),
        at_commit=tuple(bool(v) for v in values[size : 2 * size].tolist()),
        all_ask_to_skip=int(values[2 * size].item()) == size,
        all_persist=int(values[2 * size + 1].item()) == size,
        high_water=int(values[2 * size + 2 :].max().item()),
    )


def plan_reset(
    counts: Counts, rank: int, generation: int, commits: int, at_commit: bool, start_over_on_state_loss: bool
) -> ResetPlan:
    """The plan every member derives from the same counts.

    The source is the lowest rank with the most commits, so a newcomer, or a member that never received state,
    can never overwrite a survivor's progress. The full sync is skipped only when every member asked to skip it
    and holds that count. With no commits anywhere the state comes from persistence when every member has it
    (the name of the latest copy is broadcast next; :meth:`ResetPlan.without_persisted` if there is none).
    """
    best = max(counts.commits)
    source = counts.commits.index(best)
    skip = counts.all_ask_to_skip and min(counts.commits) == best
    run_callbacks = generation > 1
    lost = best == 0 and counts.high_water > 0
    if best == 0 and counts.all_persist:
        loss = StateLoss.RESUME_PERSISTED if lost else StateLoss.NONE
        return ResetPlan(
            generation, rank, source, 0, False, SyncRole.LOAD_PERSISTED, False, True, counts.high_water, loss
        )
    loss = _loss(lost, start_over_on_state_loss)
    if rank == source:
        return ResetPlan(
            generation, rank, source, best, skip, SyncRole.SOURCE, at_commit, run_callbacks, counts.high_water, loss
        )
    # Members with the same count trained in lockstep since the sync that gave them their state, so their
    # committed copies match (buffers a model updates per rank, like BatchNorm's statistics, aside): a member
    # at its last commit whose source is at its own holds what the source sends.
    keeps = best > 0 and at_commit and counts.at_commit[source] and commits == best
    role = SyncRole.RECEIVER_KEEPS_COMMITTED if keeps else SyncRole.RECEIVER_FRESH_COMMITTED
    return ResetPlan(generation, rank, source, best, skip, role, keeps, run_callbacks, counts.high_water, loss)


def _loss(lost: bool, start_over_on_state_loss: bool) -> StateLoss:
    if not lost:
        return StateLoss.NONE
    return StateLoss.START_OVER if start_over_on_state_loss else StateLoss.FAIL
