"""The driver's pure core at thousands of workers, in-process, without Ray: the CPU of each ``step``.

The core decides everything an elastic job does, so an algorithm in it that grows faster than the job shows up
here first, at sizes no cluster of ours could run. Each case feeds the core the events a real job of ``n``
workers on ``n / 4`` hosts produces at that moment, all at once (the worst round the shell can hand it), and
times the ``step`` that handles them with the process's CPU clock.
"""

from __future__ import annotations

import time
import tracemalloc
from typing import Any

from elastrain.executor._private.elastic.coordinator import CoordinatorReport
from elastrain.executor._private.elastic.driver import events as ev
from elastrain.executor._private.elastic.driver.config import CoreConfig
from elastrain.executor._private.elastic.driver.core import DriverCore
from elastrain.executor._private.elastic.driver.lifecycle import JobPhase

SLOTS_PER_HOST = 4
_GRACE_S = 30.0


class CoreJob:
    """A core of ``n`` workers and its clock; every start answers at once, like a shell with instant Ray."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.hosts = {f"host-{i}": SLOTS_PER_HOST for i in range(n // SLOTS_PER_HOST)}
        config = CoreConfig(
            min_workers=n // 2,
            max_workers=n,
            reset_limit=None,
            elastic_timeout=600.0,
            startup_grace_s=_GRACE_S,
            arrival_timeout_s=60.0,
        )
        self.core = DriverCore(config, strict=False)
        self.now = 0.0
        self.spawned: list[tuple[str, str]] = []
        self.published: Any = None

    def step(self, *events: ev.Event) -> float:
        """One round: ``events`` after discovery's view, as the shell sends them; the step's CPU seconds."""
        self.now += 0.05
        round_ = [ev.HostsSeen(ev.Hosts(dict(self.hosts))), *events]
        started = time.process_time()
        actions = self.core.step(self.now, round_)
        took = time.process_time() - started
        for action in actions:
            if isinstance(action, ev.Spawn):
                self.spawned.append((action.worker_id, action.host_id))
            elif isinstance(action, ev.Publish):
                self.published = action.world
        return took

    def prepare_spawned(self) -> float:
        """Every started worker answers ``prepare`` in one round."""
        spawned, self.spawned = self.spawned, []
        return self.step(*(ev.Prepared(worker_id, host_id) for worker_id, host_id in spawned))

    def all_arrived(self) -> float:
        """The rendezvous actor's poll once every member of the published group arrived (steady state: every
        worker beats, none is silent)."""
        return self.step(ev.Polled(CoordinatorReport()))


def core_costs(n: int) -> dict[str, float]:
    """CPU seconds of the core's step for each moment of a job of ``n`` workers."""
    job = CoreJob(n)
    costs: dict[str, float] = {}
    costs["start: spawn every worker"] = job.step()
    # The last start answered ends the start-up wait: that round publishes the first group.
    costs["start: every worker prepared, first group published"] = job.prepare_spawned()
    assert job.published is not None, "the first group was published"
    assert job.published.size == n, "the first group holds every worker"
    costs["steady: a poll, every member arrived"] = job.all_arrived()
    assert job.core.phase is JobPhase.RUNNING
    costs["steady: an idle round"] = job.step()

    victim = job.published.members[n // 2].worker_id
    costs["one failure: death to new group"] = job.step(ev.Died(victim, "actor died", False))
    assert job.published.size == n - 1, "the survivors go on at once"
    costs["one failure: replacement prepared, group published"] = job.prepare_spawned()
    job.now += _GRACE_S
    job.step()
    assert job.published.size == n, "the replacement joins"
    job.all_arrived()

    failures = [(m.worker_id, job.published.generation, "collective failed") for m in job.published.members[:-1]]
    costs["group failure reported by every survivor"] = job.step(
        ev.Died(job.published.members[-1].worker_id, "actor died", False), ev.Polled(CoordinatorReport(failures))
    )
    job.prepare_spawned()
    job.now += _GRACE_S
    job.step()
    job.all_arrived()

    for i in range(10):
        job.hosts[f"new-host-{i}"] = SLOTS_PER_HOST
    job.core.config = CoreConfig(**{**job.core.config.__dict__, "max_workers": n + 10 * SLOTS_PER_HOST})
    costs["discovery adds 10 hosts"] = job.step()
    costs["the 40 newcomers prepared, group published"] = job.prepare_spawned()
    job.now += _GRACE_S
    job.step()
    assert job.published.size == n + 10 * SLOTS_PER_HOST
    return costs


def core_memory_bytes(n: int) -> int:
    """Peak bytes the core allocates to run a job of ``n`` workers through its first group."""
    tracemalloc.start()
    try:
        job = CoreJob(n)
        job.step()
        job.prepare_spawned()
        job.now += _GRACE_S
        job.step()
        job.all_arrived()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


if __name__ == "__main__":
    for size in (8, 64, 256, 1024, 10_000):
        found = core_costs(size)
        print(size, {k: f"{v * 1e3:.2f} ms" for k, v in found.items()})
