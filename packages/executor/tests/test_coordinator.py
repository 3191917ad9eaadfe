"""The rendezvous actor wakes the driver as soon as a worker reports a failed group (its pending call answers),
keeps the job's commit high-water mark for every arriving member, and hands the driver the run's events.

The actor's class is driven on an event loop of the test's own, as Ray drives the async actor.
"""

from __future__ import annotations

import asyncio
import time

from elastrain.discovery import assign_slots
from elastrain.executor._private.elastic.coordinator import Coordinator
from elastrain.executor._private.elastic.world import Member, World


def test_a_reported_failure_answers_the_pending_watch_at_once() -> None:
    async def scenario() -> None:
        coordinator = Coordinator()
        watch = asyncio.ensure_future(coordinator.failure_reported(30.0))
        await asyncio.sleep(0.1)
        assert not watch.done(), "the watch answered before any failure was reported"
        reported_at = time.monotonic()
        await coordinator.report_failure("w1", 1, "peer gone")
        assert await asyncio.wait_for(watch, 5.0) is True
        assert time.monotonic() - reported_at < 5.0  # not the watch's 30 s
        report = await coordinator.poll(8.0)
        assert report.failures == [("w1", 1, "peer gone")]
        # Polled: nothing waits for the driver any more, so a new watch waits out its time.
        assert await coordinator.failure_reported(0.05) is False

    asyncio.run(scenario())


def test_a_failure_reported_before_the_watch_answers_it_at_once() -> None:
    async def scenario() -> None:
        coordinator = Coordinator()
        await coordinator.report_failure("w2", 3, "connection reset")
        assert await asyncio.wait_for(coordinator.failure_reported(30.0), 5.0) is True

    asyncio.run(scenario())


def world_of(generation: int, *worker_ids: str) -> World:
    slots = assign_slots({"host-1": len(worker_ids)}, len(worker_ids))
    return World(generation, tuple(Member(w, slot, 0, 1) for w, slot in zip(worker_ids, slots, strict=True)))


def test_every_member_learns_the_jobs_commit_high_water_mark_with_its_arrival() -> None:
    """The last holder of the state reports its count as it arrives; a newcomer arriving with it learns the count,
    and so does a newcomer of the next world after the holder died."""

    async def scenario() -> None:
        coordinator = Coordinator()
        await coordinator.beat("w1", 4)  # counts also come with beats
        await coordinator.publish(world_of(3, "w1", "w2"))
        holder = asyncio.ensure_future(coordinator.arrive(3, "w1", 5.0, commits=7))
        newcomer = await coordinator.arrive(3, "w2", 5.0, commits=0)
        assert (newcomer.value, newcomer.high_water) == (True, 7)
        assert (await holder).high_water == 7
        await coordinator.beat("w2", 0)  # a lower count never lowers the mark
        await coordinator.publish(world_of(4, "w2"))
        alone = await coordinator.arrive(4, "w2", 5.0, commits=0)
        assert (alone.value, alone.high_water) == (True, 7)
        await coordinator.restart_high_water()  # the workers started over, as the user allowed
        assert await coordinator.high_water() == 0

    asyncio.run(scenario())


def test_run_events_reach_the_next_poll_once() -> None:
    async def scenario() -> None:
        coordinator = Coordinator()
        fields = {"generation": 4, "lost_commits": 7}
        await coordinator.report_event("w2", "state_lost_start_over", fields)
        fields["generation"] = 5  # the actor keeps its own copy
        report = await coordinator.poll(8.0)
        assert report.events == [("w2", "state_lost_start_over", {"generation": 4, "lost_commits": 7})]
        assert report.failures == []
        assert (await coordinator.poll(8.0)).events == []

    asyncio.run(scenario())


def test_a_watch_answers_at_the_next_publish_and_a_store_wait_gives_up_when_its_world_is_replaced() -> None:
    """Workers keep one watch pending instead of asking at every commit; members waiting for rank 0's store learn
    at once that their world was replaced (rank 0 may be the one that died)."""

    async def scenario() -> None:
        coordinator = Coordinator()
        await coordinator.publish(world_of(1, "w1", "w2"))
        assert await coordinator.watch(0, 1.0) == 1, "a world newer than the caller's is there already"
        watch = asyncio.ensure_future(coordinator.watch(1, 30.0))
        store = asyncio.ensure_future(coordinator.get_store(1, 30.0))
        await asyncio.sleep(0.05)
        assert not watch.done()
        assert not store.done()
        await coordinator.publish(world_of(2, "w2"))
        assert await asyncio.wait_for(watch, 5.0) == 2
        assert await asyncio.wait_for(store, 5.0) is None
        assert await coordinator.get_store(1, 30.0) is None, "an old world's store is never waited for"
        assert await coordinator.watch(2, 0.05) is None, "nothing newer: the watch times out"
        await coordinator.set_store(2, "10.0.0.2", 1234)
        assert await coordinator.get_store(2, 0.05) == ("10.0.0.2", 1234)

    asyncio.run(scenario())
