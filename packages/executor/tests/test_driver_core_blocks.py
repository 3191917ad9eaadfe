"""Groups of whole blocks (``size_multiple``), on the driver's pure core: a death drops its block, the untouched
blocks go on with their ranks, the dead worker's block-mates wait alive, and a replacement makes the block whole.
The model-based test (test_driver_core_model.py) checks the same rules over random event sequences."""

from __future__ import annotations

from elastrain.executor._private.elastic.driver import events as ev
from elastrain.executor._private.elastic.driver.config import CoreConfig
from elastrain.executor._private.elastic.driver.core import DriverCore
from elastrain.executor._private.elastic.driver.lifecycle import JobPhase, WorkerPhase
from elastrain.executor._private.elastic.world import World


class Job:
    """The core and a clock; every worker that the core starts answers at once."""

    def __init__(self, *, min_workers: int = 2, max_workers: int | None = 4, multiple: int = 2, hosts: int = 4) -> None:
        self.hosts = ev.HostsSeen(ev.Hosts({f"h{i}": 1 for i in range(hosts)}))
        config = CoreConfig(
            min_workers=min_workers,
            max_workers=max_workers,
            reset_limit=None,
            elastic_timeout=60.0,
            startup_grace_s=30.0,
            arrival_timeout_s=10.0,
            size_multiple=multiple,
        )
        self.core = DriverCore(config, strict=True)
        self.now = 0.0
        self.worlds: list[World] = []
        self.spawned: list[str] = []

    def step(self, *events: ev.Event) -> None:
        self.now += 0.05
        for action in self.core.step(self.now, [self.hosts, *events]):
            if isinstance(action, ev.Spawn):
                self.spawned.append(action.worker_id)
            elif isinstance(action, ev.Publish):
                self.worlds.append(action.world)

    def start_all(self) -> None:
        """Answer every pending start, then let the start-up grace pass so the group forms."""
        pending = [w for w in self.spawned if (r := self.core.roster.get(w)) and r.phase is WorkerPhase.STARTING]
        self.step(*(ev.Prepared(w, self.core.roster.get(w).host_id) for w in pending))  # type: ignore[union-attr]
        self.now += 31.0
        self.step()

    @property
    def world(self) -> World:
        return self.worlds[-1]

    def ranks(self) -> list[str]:
        return [m.worker_id for m in sorted(self.world.members, key=lambda m: m.slot.rank)]


def test_a_death_drops_its_block_and_the_whole_block_goes_on_with_its_ranks() -> None:
    job = Job()
    job.step()
    job.start_all()
    assert job.ranks() == ["w0", "w1", "w2", "w3"]

    job.step(ev.Died("w1", "actor died"))  # block (w0, w1) broke; (w2, w3) is whole

    assert job.ranks() == ["w2", "w3"], "the untouched block keeps its order, so each rank keeps its shard"
    assert job.world.held == ("w0",)
    assert job.core.roster.get("w0").phase is WorkerPhase.READY  # type: ignore[union-attr]
    assert job.core.phase is JobPhase.RECOVERING

    job.start_all()  # the replacement of w1 starts and is ready: the block is whole again
    replacement = job.spawned[-1]
    # Ranks follow the hosts, as always: the replacement took w1's host, so every block is where it was and the
    # untouched one keeps each worker's shard (rank % 2).
    assert job.ranks() == ["w0", replacement, "w2", "w3"]
    assert [job.world.member(w).slot.rank % 2 for w in ("w2", "w3")] == [0, 1]  # type: ignore[union-attr]
    assert job.world.held == ()
    assert all(job.core.roster.get(w).phase is WorkerPhase.MEMBER for w in job.ranks())  # type: ignore[union-attr]


def test_a_lone_survivor_waits_until_a_second_worker_is_ready() -> None:
    job = Job(min_workers=2, max_workers=2)
    job.step()
    job.start_all()
    job.step(ev.Died("w0", "actor died"))
    assert job.core.phase is JobPhase.WAITING, "one worker is no whole block: the job waits for a second"
    assert job.ranks() == ["w0", "w1"]
    job.start_all()
    assert sorted(job.ranks()) == ["w1", job.spawned[-1]]


def test_survivors_of_two_broken_blocks_form_a_block_together() -> None:
    job = Job(min_workers=2, max_workers=6, hosts=6)
    job.step()
    job.start_all()
    assert job.ranks() == ["w0", "w1", "w2", "w3", "w4", "w5"]
    job.step(ev.Died("w1", "actor died"), ev.Died("w2", "actor died"))
    # Blocks (w0, w1) and (w2, w3) broke; w0 and w3 make a block together with the whole (w4, w5), and every
    # worker keeps its shard (rank % 2).
    assert job.ranks() == ["w0", "w3", "w4", "w5"]
    assert job.world.held == ()


def test_no_worker_starts_beyond_the_last_whole_block() -> None:
    job = Job(min_workers=2, max_workers=None, hosts=3)
    job.step()
    assert len(job.spawned) == 2, "a third worker would never be in a group of whole pairs"


def test_without_a_multiple_every_survivor_stays() -> None:
    job = Job(multiple=1, min_workers=1)
    job.step()
    job.start_all()
    job.step(ev.Died("w1", "actor died"))
    assert job.ranks() == ["w0", "w2", "w3"]
    assert job.world.held == ()
