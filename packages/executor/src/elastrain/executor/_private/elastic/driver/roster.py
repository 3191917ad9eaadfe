"""The driver core's record of its workers: who they are, where, and in which phase of their lifecycle."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from elastrain.executor._private.elastic.driver.lifecycle import COUNTED, WorkerPhase, move

if TYPE_CHECKING:
    from elastrain.executor._private.elastic.world import World


@dataclass
class WorkerRecord:
    worker_id: str
    host_id: str  # "" for a spare until Ray placed it
    phase: WorkerPhase
    spawned_at: float
    node_id: str | None = None  # where it runs, once it is prepared
    held: bool = False  # a member left out of the latest group (size_multiple) that waits, alive, to rejoin
    sequence: int = 0  # the order the call started its workers in

    @property
    def joined(self) -> bool:
        """Whether it was published into a group (so it holds committed state; ranks put it first)."""
        return self.phase is WorkerPhase.MEMBER

    @property
    def counts(self) -> bool:
        return self.phase in COUNTED


class Roster:
    """Every worker the current call started and has not forgotten, in the order they were started.

    Workers are also indexed by phase, so that what the core asks every round (who is starting, how many count)
    costs what the answer holds, not the job's size: at thousands of workers most rounds change nothing.
    """

    def __init__(self, *, strict: bool) -> None:
        self.strict = strict
        self._ids = itertools.count()
        self._workers: dict[str, WorkerRecord] = {}
        self._by_phase: dict[WorkerPhase, dict[str, WorkerRecord]] = {phase: {} for phase in WorkerPhase}

    def __iter__(self) -> Iterator[WorkerRecord]:
        return iter(list(self._workers.values()))

    def __len__(self) -> int:
        return len(self._workers)

    def get(self, worker_id: str) -> WorkerRecord | None:
        return self._workers.get(worker_id)

    def add(self, host_id: str, phase: WorkerPhase, now: float) -> WorkerRecord:
        sequence = next(self._ids)
        worker = WorkerRecord(f"w{sequence}", host_id, phase, now, sequence=sequence)
        self._workers[worker.worker_id] = worker
        self._by_phase[phase][worker.worker_id] = worker
        return worker

    def move(self, worker: WorkerRecord, phase: WorkerPhase) -> None:
        self._by_phase[worker.phase].pop(worker.worker_id, None)
        worker.phase = move(worker.phase, phase, what=f"worker {worker.worker_id}", strict=self.strict)
        if phase is WorkerPhase.GONE:
            self._workers.pop(worker.worker_id, None)
        else:
            self._by_phase[phase][worker.worker_id] = worker

    def in_phase(self, *phases: WorkerPhase) -> list[WorkerRecord]:
        """The workers in any of ``phases``, in the order they were started."""
        found = [w for phase in phases for w in self._by_phase[phase].values()]
        found.sort(key=_started_order)  # a phase's index holds them in the order they entered it
        return found

    def count(self, *phases: WorkerPhase) -> int:
        return sum(len(self._by_phase[phase]) for phase in phases)

    def counted(self) -> list[WorkerRecord]:
        return self.in_phase(*COUNTED)

    def group_broken(self, world: World | None) -> bool:
        """Whether a member of ``world`` is no longer running."""
        if world is None:
            return False
        running = (WorkerPhase.MEMBER, WorkerPhase.LEAVING)
        return any((w := self.get(m.worker_id)) is None or w.phase not in running for m in world.members)

    def leaving_members(self, world: World | None) -> list[WorkerRecord]:
        """Members of ``world`` that leave at their next commit."""
        return [w for w in self.in_phase(WorkerPhase.LEAVING) if world is not None and world.member(w.worker_id)]


def _started_order(worker: WorkerRecord) -> int:
    return worker.sequence
