"""The driver's pure core at sizes no test cluster reaches (thousands of workers), and the rendezvous actor with
a thousand members waiting at once. These check what each step decides at that size, never how long it takes:
the costs are measured by ``nox -s scale`` (benchmarks/scale)."""

from __future__ import annotations

import asyncio

from elastrain.executor._private.elastic.coordinator import Coordinator, CoordinatorReport
from elastrain.executor._private.elastic.driver import events as ev
from elastrain.executor._private.elastic.driver.config import CoreConfig
from elastrain.executor._private.elastic.driver.core import DriverCore
from elastrain.executor._private.elastic.driver.lifecycle import JobPhase, WorkerPhase
from elastrain.executor._private.elastic.world import PackedWorld, World

SLOTS = 4


class Job:
    """A core on ``n / 4`` hosts of 4 slots; every start answers at once."""

    def __init__(self, n: int, *, min_workers: int | None = None) -> None:
        self.hosts = {f"host-{i}": SLOTS for i in range(n // SLOTS)}
        config = CoreConfig(
            min_workers=min_workers or n // 2,
            max_workers=n,
            reset_limit=None,
            elastic_timeout=600.0,
            startup_grace_s=30.0,
            arrival_timeout_s=60.0,
        )
        self.core = DriverCore(config, strict=True)
        self.now = 0.0
        self.starting: list[tuple[str, str]] = []
        self.worlds: list[World] = []
        self.actions: list[ev.Action] = []

    def step(self, *events: ev.Event) -> None:
        self.now += 0.05
        self.actions = self.core.step(self.now, [ev.HostsSeen(ev.Hosts(dict(self.hosts))), *events])
        for action in self.actions:
            if isinstance(action, ev.Spawn):
                self.starting.append((action.worker_id, action.host_id))
            elif isinstance(action, ev.Publish):
                self.worlds.append(action.world)

    def prepare_all(self) -> None:
        starting, self.starting = self.starting, []
        self.step(*(ev.Prepared(worker_id, host) for worker_id, host in starting))


def test_four_thousand_workers_form_a_group_lose_one_and_take_its_replacement() -> None:
    job = Job(4096)
    job.step()
    assert len(job.starting) == 4096
    job.prepare_all()
    first = job.worlds[-1]
    assert first.size == 4096
    assert [m.slot.rank for m in first.members] == list(range(4096))
    assert {m.slot.cross_size for m in first.members} == {1024}, "each local rank is on all 1,024 hosts"
    job.step(ev.Polled(CoordinatorReport()))
    assert job.core.phase is JobPhase.RUNNING
    job.step()
    assert job.actions == [], "a round where nothing happened does nothing"

    victim = first.members[2049]
    job.step(ev.Died(victim.worker_id, "actor died"))
    survivors = job.worlds[-1]
    assert survivors.size == 4095
    assert survivors.member(victim.worker_id) is None
    assert [m.worker_id for m in survivors.members] == [m.worker_id for m in first.members if m != victim]
    assert job.starting == [(job.starting[0][0], victim.slot.host_id)], "one replacement, on the lost slot's host"

    job.prepare_all()
    job.now += 31.0
    job.step()
    assert job.worlds[-1].size == 4096
    assert job.worlds[-1].members[2049].slot.host_id == victim.slot.host_id


def test_a_stopping_worker_lost_with_its_node_leaves_nothing_to_start_there() -> None:
    """Found by the model test: a worker the core was already stopping died with its node. Not a failure, but
    the host must not get a replacement before discovery drops it."""
    job = Job(8, min_workers=4)
    job.step()
    job.prepare_all()
    world = job.worlds[-1]
    host = world.members[0].slot.host_id
    job.hosts[host] = 1  # discovery: the host shrinks to one slot, so its second worker stops
    job.step(ev.HostShrunk(host, 1))
    leaving = [w for w in job.core.roster if w.host_id == host and w.phase is WorkerPhase.LEAVING]
    assert leaving
    job.starting.clear()
    job.step(ev.Died(leaving[0].worker_id, "node died", node_lost=True), ev.Died(world.members[0].worker_id, "x"))
    assert all(h != host for _, h in job.starting), f"started a worker on {host}, whose node is gone"
    assert host in job.core.hosts.blacklisted


def test_a_thousand_members_join_and_arrive_together() -> None:
    """Each arrival wakes only what it concerns; every member still learns its group and that all arrived."""
    job = Job(1024)
    job.step()
    job.prepare_all()
    world = job.worlds[-1]

    async def scenario() -> None:
        coordinator = Coordinator()

        async def member(worker_id: str) -> tuple[int, bool]:
            joined = await coordinator.join(worker_id, 0, 30.0)
            assert isinstance(joined.value, PackedWorld)
            assert joined.value.unpack() == world  # the same bytes for every member, unpickled once per process
            arrived = await coordinator.arrive(joined.value.generation, worker_id, 30.0)
            return joined.value.generation, bool(arrived.value)

        waiting = [asyncio.ensure_future(member(m.worker_id)) for m in world.members]
        await asyncio.sleep(0.05)
        await coordinator.publish(world)
        assert await asyncio.wait_for(asyncio.gather(*waiting), 60.0) == [(world.generation, True)] * 1024
        report = await coordinator.poll(8.0)
        assert report.missing is None

        # A newer world while half of it arrived: the early half learn it was replaced, the rest join it.
        smaller = World(world.generation + 1, world.members[:512])
        newest = World(world.generation + 2, world.members[:256])
        await coordinator.publish(smaller)
        early = [
            asyncio.ensure_future(coordinator.arrive(smaller.generation, m.worker_id, 30.0)) for m in newest.members
        ]
        await asyncio.sleep(0.05)
        await coordinator.publish(newest)
        assert [r.value for r in await asyncio.wait_for(asyncio.gather(*early), 60.0)] == [False] * 256
        report = await coordinator.poll(8.0)
        assert report.missing is not None
        assert len(report.missing[2]) == 256

    asyncio.run(scenario())
