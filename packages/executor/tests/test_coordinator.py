"""The rendezvous actor wakes the driver as soon as a worker reports a failed group (its pending call answers).

The actor's class is driven on an event loop of the test's own, as Ray drives the async actor.
"""

from __future__ import annotations

import asyncio
import time

from elastrain.executor._private.elastic.coordinator import Coordinator


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
