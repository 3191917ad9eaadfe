"""The message sink's buffer is bounded: the oldest messages are dropped, counted, and skipped in order."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pytest

from elastrain.executor._private.messages import MessagePump, MessageSink

pytestmark = pytest.mark.usefixtures("ray_4_cpus")


def sink(**bounds: int) -> Any:
    import ray

    return ray.remote(MessageSink).options(num_cpus=0).remote(**bounds)


def put(actor: Any, call_id: int, sender: str, seqs: range | list[int], size: int = 0) -> None:
    """Puts one at a time, so they arrive in this order."""
    import ray

    for seq in seqs:
        ray.get(actor.put.remote((call_id, sender, seq, {"seq": seq, "pad": "x" * size})), timeout=30)


def pull(actor: Any) -> tuple[list[int], dict[tuple[int, str], tuple[int, int]]]:
    import ray

    messages, dropped = ray.get(actor.pull.remote(0.0), timeout=30)
    return [envelope[2] for envelope in messages], dropped


def test_a_full_buffer_drops_the_oldest_messages_and_says_which() -> None:
    actor = sink(max_messages=5)
    put(actor, 1, "0", range(12))
    put(actor, 1, "1", range(2))
    assert pull(actor) == ([9, 10, 11, 0, 1], {(1, "0"): (8, 9)})  # the last dropped, and how many
    assert pull(actor) == ([], {})  # a pull empties the buffer and the drop record


def test_the_buffer_is_bounded_in_bytes_too() -> None:
    actor = sink(max_bytes=2500)
    put(actor, 1, "0", range(3), size=1000)  # ~1 KiB each: two fit
    put(actor, 1, "1", [0], size=5000)  # larger than the whole buffer: dropped on arrival
    assert pull(actor) == ([1, 2], {(1, "0"): (0, 1), (1, "1"): (0, 1)})


def test_bad_bounds() -> None:
    with pytest.raises(ValueError, match="needs max_messages >= 1 and max_bytes >= 1, got 0"):
        MessageSink(max_messages=0)


def test_callbacks_skip_the_dropped_messages_and_keep_the_order(caplog: pytest.LogCaptureFixture) -> None:
    actor = sink(max_messages=5)
    seen: list[tuple[str, int]] = []
    first_batch_seen = threading.Event()

    def callback(message: dict[str, Any]) -> None:
        seen.append((message["sender"], message["seq"]))
        first_batch_seen.set()

    put_tagged(actor, 6, "a", range(3))  # an earlier call's late messages: dropped, never delivered
    put_tagged(actor, 7, "a", range(20))  # the sink keeps 15..19
    with caplog.at_level(logging.WARNING, logger="elastrain.executor"):
        pump = MessagePump(actor, [callback], 7).start()
        assert first_batch_seen.wait(30)
        put_tagged(actor, 7, "a", [21, 20])  # out of order on arrival: delivered in order
        put_tagged(actor, 7, "b", range(3))
        deadline = time.monotonic() + 30
        while len(seen) < 10 and time.monotonic() < deadline:
            time.sleep(0.05)
        pump.stop(30)
    assert [seq for sender, seq in seen if sender == "a"] == [15, 16, 17, 18, 19, 20, 21]
    assert [seq for sender, seq in seen if sender == "b"] == [0, 1, 2]
    assert pump.dropped == 15  # of this call; the earlier call's drops do not count
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len([w for w in warnings if "the oldest messages are dropped" in w]) == 1
    assert "15 messages of this call were dropped" in warnings[-1]


def put_tagged(actor: Any, call_id: int, sender: str, seqs: range | list[int]) -> None:
    import ray

    for seq in seqs:
        ray.get(actor.put.remote((call_id, sender, seq, {"sender": sender, "seq": seq})), timeout=30)
