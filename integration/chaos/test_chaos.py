"""Chaos on a 3-node ``ray.cluster_utils.Cluster``: one elastic job with one worker per node goes through a
seeded random mix of worker kills (SIGKILL), worker freezes (SIGSTOP, then SIGKILL as an operator would), node
removals and node additions, one at a time, each injected a random number of steps after the job is back at
full size. Expected:

- the job ends with exactly the weights of a run that never failed (``kit.training``);
- after each event the job trains its next step within that event's bound, which comes from the settings and the
  documented behaviour (a freeze: ``liveness_timeout_s`` plus the tenth of a second detection takes plus a margin;
  a kill or a lost node: the peers' collectives fail at once), and is back at full size within ``timeout_s``
  (the bound on a worker's start);
- the driver counted what was injected: one eviction per freeze, one smaller world per kill, freeze and removal,
  one larger world per replacement and added node, and a reset for each of those worlds (plus at most one
  re-formed group of the same members per failure: the group's failure can reach the driver before Ray says
  the worker died);
- no process is ever left stopped.

The scenario prints a table of the events (kind, target, when, time to the next step, time back to full size)
and the totals per kind. ``ELASTRAIN_CHAOS_SEED`` replays a run's choices (the seed is printed first).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kit.observing import Truth
from kit.processes import still_there
from kit.training import reference, train

from elastrain.executor import RayExecutor
from elastrain_testutils.ray_testing import NODE_DEFAULTS, local_cluster
from elastrain_testutils.waiting import wait_until

FULL = 3  # nodes, and workers: one per node
NODE_CPUS = 1
CPUS_PER_WORKER = 0.75  # one slot per node; a spare waiting for a new node fits nowhere else
EVENTS = {"kill": 3, "freeze": 2, "remove": 2, "add": 2}
STEPS_BEFORE_EVENT = (3, 15)  # after the job is back at full size, this many steps (at random) before the next
LIVENESS_S = 3.0
TIMEOUT_S = 30.0  # a worker's start (a replacement, a new node's worker) and a process group's formation
DETECTION_S = 0.1  # the driver polls the rendezvous this often (docs/elastic.md: liveness_timeout_s + 0.1 s)
MARGIN_S = 5.0  # a loaded 2-core machine: a rollback, a new group, a Ray task to kill a stopped process
KILL_BOUND_S = MARGIN_S  # a dead peer's sockets close: collectives fail at once, survivors go on
FREEZE_BOUND_S = LIVENESS_S + DETECTION_S + MARGIN_S
STOP_MARGIN_STEPS = 40  # the last step is set this far ahead, so every rank reads it before getting there


@dataclass
class Event:
    kind: str
    target: str = ""
    step: int = 0  # the highest step reported when it was injected
    at: float = 0.0  # time.time() when it was injected
    size: int = FULL  # the job's size before it
    to_step_s: float | None = None  # until the next step (of a new group, after a failure)
    to_full_s: float | None = None  # until every worker of the job at its new full size trained a step
    notes: list[str] = field(default_factory=list)

    @property
    def failure(self) -> bool:
        return self.kind != "add"

    @property
    def bound_s(self) -> float:
        """The bound on the wait for the next step: the job goes on at once unless a frozen worker holds it."""
        return FREEZE_BOUND_S if self.kind == "freeze" else KILL_BOUND_S

    @property
    def full_bound_s(self) -> float:
        """The bound on the wait for the job at its new full size: a replacement (or a new node's worker) starts
        within ``timeout_s``; a removed node's worker is not replaced."""
        return self.bound_s if self.kind == "remove" else self.bound_s + TIMEOUT_S


class Progress(Truth):
    """Every message the workers sent, besides what ``Truth`` keeps."""

    def __init__(self) -> None:
        super().__init__()
        self.messages: list[dict[str, Any]] = []

    def __call__(self, message: dict[str, Any]) -> None:
        super().__call__(message)
        with self.lock:
            self.messages.append(message)

    def first_step_after(self, at: float, resets_above: int | None) -> float | None:
        """Seconds from ``at`` to the first step trained after it (in a group formed after more than
        ``resets_above`` resets, when given)."""
        with self.lock:
            times = [
                m["t"] for m in self.messages if m["t"] > at and (resets_above is None or m["resets"] > resets_above)
            ]
        return min(times) - at if times else None

    def highest_resets(self) -> int:
        with self.lock:
            size = self.sizes[-1] if self.sizes else 0
            return max((m["resets"] for rank, m in self.latest.items() if rank < size), default=0)

    def rank_on(self, node_id: str, size: int) -> int | None:
        with self.lock:
            return next((r for r, m in self.latest.items() if r < size and m["node"] == node_id), None)


def plan(rng: random.Random) -> list[str]:
    """The events in a random order in which the cluster keeps between FULL - 1 and FULL nodes."""
    kinds = [kind for kind, count in EVENTS.items() for _ in range(count)]
    while True:
        rng.shuffle(kinds)
        nodes, possible = FULL, True
        for kind in kinds:
            nodes += {"remove": -1, "add": 1}.get(kind, 0)
            possible &= FULL - 1 <= nodes <= FULL
        if possible:
            return list(kinds)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    nodes = [{"num_cpus": NODE_CPUS}] * FULL
    with local_cluster(*nodes) as cluster:
        yield cluster


@pytest.fixture
def frozen() -> Iterator[list[int]]:
    """Pids the scenario stopped; any still there at the end is killed, whatever happened."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        if still_there(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.timeout(240)
def test_chaos(cluster: Any, frozen: list[int], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    seed = int(os.environ.get("ELASTRAIN_CHAOS_SEED") or random.SystemRandom().randrange(2**31))
    with capsys.disabled():
        print(f"\nELASTRAIN_CHAOS_SEED={seed}", flush=True)
    rng = random.Random(seed)  # noqa: S311 - chaos, not secrets
    kinds = plan(rng)

    progress = Progress()
    stop_file = tmp_path / "stop"
    settings = RayExecutor.create_settings(timeout_s=TIMEOUT_S, discovery_interval_s=0.2, liveness_timeout_s=LIVENESS_S)
    executor = RayExecutor(
        settings, min_workers=1, max_workers=FULL, cpus_per_worker=CPUS_PER_WORKER, elastic_timeout=60
    )
    events: list[Event] = []
    nodes = FULL

    def context() -> str:
        return f"seed {seed}; events: {[(e.kind, e.target, e.step) for e in events]}; sizes seen: {progress.sizes}"

    def back_to_full(size: int, resets_above: int, timeout_s: float, after: str) -> None:
        wait_until(
            lambda: progress.settled(size, resets_above),
            timeout_s=timeout_s,
            what=f"every worker of a job of {size} to train after {after}; {context()}",
            interval_s=0.02,
        )

    def inject(event: Event) -> None:
        """Inject ``event`` (from this thread: Ray's Cluster must be changed from it)."""
        nonlocal nodes
        if event.kind in ("kill", "freeze"):
            rank = rng.randrange(event.size)
            pid = progress.pid_of(rank)
            event.target = f"rank {rank} (pid {pid})"
            event.step, event.at = progress.step, time.time()
            if event.kind == "freeze":
                frozen.append(pid)
            os.kill(pid, signal.SIGKILL if event.kind == "kill" else signal.SIGSTOP)
        elif event.kind == "remove":
            node = rng.choice(cluster.list_all_nodes()[1:])  # never the head: it holds the control plane
            event.target = f"node {node.node_id[:8]} (rank {progress.rank_on(node.node_id, event.size)})"
            event.step, event.at = progress.step, time.time()
            cluster.remove_node(node)
            nodes -= 1
        else:
            event.step, event.at = progress.step, time.time()
            node = cluster.add_node(num_cpus=NODE_CPUS, **NODE_DEFAULTS)
            event.target = f"node {node.node_id[:8]}"
            nodes += 1

    stats: Any = None
    worlds_before = resets_before = 0
    try:
        with ThreadPoolExecutor(1) as pool, executor:
            executor.start()
            job = pool.submit(executor.run, train, [1_000_000], {"stop_file": str(stop_file)}, [progress])
            back_to_full(FULL, -1, TIMEOUT_S * 2, "the start")
            stats = executor._elastic.driver.stats  # type: ignore[union-attr]
            worlds_before, resets_before = len(stats.worlds), stats.resets

            for kind in kinds:
                target_step = progress.step + rng.randint(*STEPS_BEFORE_EVENT)
                wait_until(lambda: progress.step >= target_step, timeout_s=60, what=f"step {target_step}; {context()}")  # noqa: B023
                resets = progress.highest_resets()
                event = Event(kind, size=nodes)  # one worker per node, every one running
                inject(event)
                events.append(event)
                # The next step: after a failure, a new group's (the survivors roll back and go on without it).
                event.to_step_s = wait_until(
                    lambda: progress.first_step_after(event.at, resets if event.failure else None),  # noqa: B023
                    timeout_s=event.bound_s + TIMEOUT_S,
                    what=f"a step after the {kind} of {event.target}; {context()}",
                    interval_s=0.02,
                )
                if kind == "freeze":
                    # An operator kills the stopped process. The driver evicted it, killing it on its node, before
                    # its peers could go on: nothing should be left to kill.
                    pid = frozen[-1]
                    if still_there(pid):
                        os.kill(pid, signal.SIGKILL)
                        event.notes.append("still there when the job went on: killed by the scenario")
                    else:
                        event.notes.append("already gone when the job went on")
                back_to_full(nodes, resets, event.full_bound_s + TIMEOUT_S, f"the {kind} of {event.target}")
                event.to_full_s = time.time() - event.at

            last_step = progress.step + STOP_MARGIN_STEPS
            (tmp_path / "stop.tmp").write_text(str(last_step))
            os.replace(tmp_path / "stop.tmp", stop_file)
            results = job.result(timeout=TIMEOUT_S * 2)
    finally:
        with capsys.disabled():
            print(report(events, stats, worlds_before, resets_before), flush=True)

    # Exactly the weights of a run that never failed: nothing committed lost, nothing applied twice.
    expected = reference(last_step)
    assert len(results) == FULL
    for result in results:
        assert result["weights"] == pytest.approx(expected, rel=1e-9, abs=1e-12), context()

    # No wait past its bound, and no process left stopped.
    for event in events:
        assert event.to_step_s is not None
        assert event.to_step_s <= event.bound_s, f"{event}; {context()}"
        assert event.to_full_s is not None
        assert event.to_full_s <= event.full_bound_s, f"{event}; {context()}"
        assert not any("still there" in note for note in event.notes), f"{event}; {context()}"
    assert not [pid for pid in frozen if still_there(pid)]

    # Every event counted, and the driver counted what was injected: an eviction per freeze, a smaller world
    # per failure, a larger one per replacement or added node, and a reset for each world after the first.
    count = {kind: sum(e.kind == kind for e in events) for kind in EVENTS}
    assert count == EVENTS
    failures = count["kill"] + count["freeze"] + count["remove"]
    worlds = stats.worlds[worlds_before - 1 :]
    shrinks, grows, repeats = changes(worlds)
    assert stats.evictions == count["freeze"], context()
    assert shrinks == failures, f"worlds {worlds}; {context()}"
    assert grows == count["kill"] + count["freeze"] + count["add"], f"worlds {worlds}; {context()}"
    # A group's failure can reach the driver before Ray says its worker died; the driver then re-forms the group
    # with the same members once, and again without the dead one a moment later: at most one per failure.
    assert repeats <= failures, f"worlds {worlds}; {context()}"
    assert stats.resets - resets_before == len(worlds) - 1 == shrinks + grows + repeats, f"worlds {worlds}"
    assert worlds[-1] == FULL


def changes(worlds: list[int]) -> tuple[int, int, int]:
    """How often consecutive worlds got smaller, larger, or kept their size."""
    pairs = list(itertools.pairwise(worlds))
    return sum(b < a for a, b in pairs), sum(b > a for a, b in pairs), sum(b == a for a, b in pairs)


def seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def report(events: list[Event], stats: Any, worlds_before: int, resets_before: int) -> str:
    """The events as a table (times from the first event), totals per kind, and what the driver counted."""
    start = events[0].at if events else 0.0
    rows = [("event", "target", "when", "step", "size", "to next step", "bound", "to full size", "bound", "notes")]
    for e in events:
        rows.append(
            (
                e.kind,
                e.target,
                f"{e.at - start:.1f} s",
                str(e.step),
                str(e.size),
                seconds(e.to_step_s),
                seconds(e.bound_s),
                seconds(e.to_full_s),
                seconds(e.full_bound_s),
                "; ".join(e.notes),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["", "chaos: events"]
    for row in rows:
        lines.append("  " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
    lines.append("chaos: totals per kind")
    for kind in EVENTS:
        mine = [e for e in events if e.kind == kind]
        to_step = [e.to_step_s for e in mine if e.to_step_s is not None]
        to_full = [e.to_full_s for e in mine if e.to_full_s is not None]
        lines.append(
            f"  {kind:<6}  {len(mine)}  to next step max {seconds(max(to_step, default=None))}, "
            f"to full size max {seconds(max(to_full, default=None))}"
        )
    if stats is not None:
        worlds = stats.worlds[worlds_before - 1 :]
        shrinks, grows, repeats = changes(worlds)
        lines.append(
            f"chaos: the driver counted {stats.resets - resets_before} resets ({shrinks} smaller worlds, {grows} "
            f"larger, {repeats} of the same size) and {stats.evictions} evictions since the first event; "
            f"world sizes {worlds}"
        )
    if events:
        lines.append(f"chaos: {time.time() - start:.1f} s from the first event to the end")
    return "\n".join(lines)
