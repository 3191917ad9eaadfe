"""Worker-to-driver messages: a small actor that buffers what workers ``send()``, and the driver-side pump."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import pickle
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

logger = logging.getLogger("elastrain.executor")

Callback = Callable[[dict[str, Any]], None]
# How long one pull waits for a message; bounds how late the pump notices that it should stop.
_PULL_WAIT_S = 0.5


# (call id, sender: the worker's stable id, sequence number within the call, message)
Envelope = tuple[int, str, int, dict[str, Any]]
# What was dropped since the last pull: per (call id, sender), the highest sequence number dropped and how many.
Dropped = dict[tuple[int, str], tuple[int, int]]
# What one pull returns: the buffered messages, and what was dropped.
Batch = tuple[list[Envelope], Dropped]

# A worker hands the sink at most this many messages in one call, and gives up on an acknowledgement after this long.
_BATCH_MAX = 1_000
_ACK_TIMEOUT_S = 30.0
# The sink holds at most this many messages, and this many bytes of them (pickled), until the driver pulls.
MAX_MESSAGES = 10_000
MAX_BYTES = 64 * 1024 * 1024


class MessageSink:
    """Ray actor (async, zero CPU) holding messages until the driver pulls them.

    An async actor may run one caller's ``put``s out of order, so each message carries its sequence number
    and the driver restores the order.

    The buffer is bounded by ``max_messages`` and ``max_bytes``. Workers never wait on it (a ``send()`` must not
    stall training because callbacks are slow); when it is full the oldest messages are dropped, and a message
    larger than ``max_bytes`` on its own is dropped on arrival. Each pull reports what was dropped, so the
    driver skips the gaps instead of waiting for them; it warns at a call's first drop and gives the count when
    the call ends.
    """

    def __init__(self, max_messages: int = MAX_MESSAGES, max_bytes: int = MAX_BYTES) -> None:
        if max_messages < 1 or max_bytes < 1:
            raise ValueError(
                f"MessageSink needs max_messages >= 1 and max_bytes >= 1, got {max_messages}, {max_bytes}."
            )
        self._max_messages = max_messages
        self._max_bytes = max_bytes
        self._messages: collections.deque[tuple[Envelope, int]] = collections.deque()
        self._bytes = 0
        self._dropped: Dropped = {}
        self._arrived = asyncio.Event()

    async def put(self, envelope: Envelope) -> None:
        self._add(envelope)

    async def put_many(self, envelopes: list[Envelope]) -> None:
        """Several messages in one call (a worker's :class:`MessageSender` batches what piled up)."""
        for envelope in envelopes:
            self._add(envelope)

    def _add(self, envelope: Envelope) -> None:
        size = _size(envelope[3])
        if size > self._max_bytes:
            self._drop(envelope)
            return
        self._messages.append((envelope, size))
        self._bytes += size
        while len(self._messages) > self._max_messages or self._bytes > self._max_bytes:
            oldest, oldest_size = self._messages.popleft()
            self._bytes -= oldest_size
            self._drop(oldest)
        self._arrived.set()

    async def pull(self, wait_s: float) -> Batch:
        """Everything buffered and what was dropped, waiting up to ``wait_s`` for the first message."""
        if not self._messages and not self._dropped:
            try:
                await asyncio.wait_for(self._arrived.wait(), wait_s)
            except TimeoutError:
                return [], {}
        batch = ([envelope for envelope, _ in self._messages], self._dropped)
        self._messages, self._bytes = collections.deque(), 0
        self._dropped = {}
        self._arrived.clear()
        return batch

    def _drop(self, envelope: Envelope) -> None:
        call_id, sender, seq, _ = envelope
        key = (call_id, sender)
        last, count = self._dropped.get(key, (-1, 0))
        self._dropped[key] = (max(last, seq), count + 1)
        self._arrived.set()  # the driver learns of the gap without waiting for the next message


class MessageSender:
    """A worker's side of ``send()``: hands its messages to the sink with one call in flight at a time.

    ``send`` only appends to a buffer, so training never waits on the sink. A thread sends what is buffered in one
    ``put_many`` call and, once the sink acknowledged it, whatever came meanwhile. At a few messages a second each
    goes alone, a round trip behind; when several come at once, or the sink is slow (a thousand workers sending
    into one sink), they share a call, so the sink's calls grow with its own pace rather than with the messages.
    """

    def __init__(self) -> None:
        self._buffer: list[tuple[Any, Envelope]] = []  # (sink, envelope), in the order sent
        self._in_flight = False
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None

    def send(self, sink: Any, envelope: Envelope) -> None:
        with self._changed:
            self._buffer.append((sink, envelope))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="elastrain-send", daemon=True)
                self._thread.start()
            self._changed.notify_all()

    def flush(self, timeout_s: float) -> bool:
        """Wait until the sink acknowledged every message sent so far; whether it did within ``timeout_s``."""
        with self._changed:
            return self._changed.wait_for(lambda: not self._buffer and not self._in_flight, timeout_s)

    def _run(self) -> None:
        import ray

        while True:
            with self._changed:
                self._changed.wait_for(lambda: bool(self._buffer))
                sink = self._buffer[0][0]
                count = 0
                while count < len(self._buffer) and count < _BATCH_MAX and self._buffer[count][0] is sink:
                    count += 1
                batch = [envelope for _, envelope in self._buffer[:count]]
                del self._buffer[:count]
                self._in_flight = True
            try:
                ray.get(sink.put_many.remote(batch), timeout=_ACK_TIMEOUT_S)
            except Exception as error:  # the sink is gone with its executor, or stuck: these messages are lost
                logger.debug("Could not hand %d messages to the message sink: %s", len(batch), error)
            finally:
                with self._changed:
                    self._in_flight = False
                    self._changed.notify_all()


def _size(message: dict[str, Any]) -> int:
    """A message's pickled size, what it costs the sink to hold (roughly)."""
    try:
        return len(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))
    except Exception:  # Ray pickled it with cloudpickle (a lambda in a message, say)
        from ray import cloudpickle

        return len(cloudpickle.dumps(message))


class MessagePump:
    """Delivers messages from a sink to callbacks on a driver thread while a call runs.

    A callback that raises stops delivery; :meth:`stop` then re-raises its error on the calling thread.
    """

    def __init__(
        self, sink: Any, callbacks: Sequence[Callback], call_id: int, tick: Callable[[], None] | None = None
    ) -> None:
        self._sink = sink
        self._callbacks = list(callbacks)
        self._call_id = call_id
        self._tick = tick  # called after every pull (at least every _PULL_WAIT_S), on the pump's thread
        self._next_seq: dict[str, int] = {}
        self._held: dict[tuple[str, int], dict[str, Any]] = {}  # arrived ahead of an earlier message
        self._stopping = threading.Event()
        self._error: BaseException | None = None
        self.dropped = 0  # messages of this call the sink dropped because its buffer was full
        self._thread = threading.Thread(target=self._pump, name="elastrain-callbacks", daemon=True)

    def start(self) -> MessagePump:
        self._thread.start()
        return self

    def stop(self, timeout_s: float) -> None:
        """Deliver what is still buffered, then stop; raise what a callback raised."""
        self._stopping.set()
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            logger.warning("Callback delivery did not finish within %s s; later messages are dropped.", timeout_s)
        if self.dropped:
            logger.warning("%d messages of this call were dropped: the message buffer was full.", self.dropped)
        if self._error is not None:
            raise self._error

    def _pump(self) -> None:
        import ray

        while True:
            stopping = self._stopping.is_set()
            wait_s = 0.0 if stopping else _PULL_WAIT_S
            try:
                messages, dropped = ray.get(self._sink.pull.remote(wait_s), timeout=wait_s + 30)
            except Exception as error:  # the sink died with the executor: nothing more will arrive
                logger.debug("Message sink unavailable: %s", error)
                return
            gaps = {
                sender: last_and_count for (call, sender), last_and_count in dropped.items() if call == self._call_id
            }
            self._note_dropped(sum(count for _, count in gaps.values()))
            try:
                for message in self._in_order(messages, gaps):
                    for callback in self._callbacks:
                        callback(message)
            except BaseException as error:
                self._error = error
                return
            if self._tick is not None:
                self._tick()
            if stopping and not messages and not gaps:
                return

    def _note_dropped(self, count: int) -> None:
        if not count:
            return
        if not self.dropped:
            logger.warning(
                "Workers send() messages faster than the callbacks take them and the message buffer is full: the "
                "oldest messages are dropped (counted; the rest still arrive in order). Send less often or less, or "
                "make the callbacks faster."
            )
        self.dropped += count

    def _in_order(self, batch: list[Envelope], dropped: dict[str, tuple[int, int]]) -> list[dict[str, Any]]:
        """The messages of this call that are next in their worker's sequence; holds the rest back.

        A sequence number the sink dropped is a gap to skip, not a message to wait for.
        """
        ready: list[dict[str, Any]] = []
        for call_id, sender, seq, message in batch:
            # a message a worker sent late in an earlier call, or one behind a gap already skipped, is dropped
            if call_id == self._call_id and seq >= self._next_seq.get(sender, 0):
                self._held[(sender, seq)] = message
        skip_to = {sender: last for sender, (last, _) in dropped.items()}
        for sender in sorted({sender for sender, _ in self._held} | set(skip_to)):
            seq = self._next_seq.get(sender, 0)
            last_dropped = skip_to.get(sender, -1)
            if last_dropped >= seq:  # deliver what survived below the gap, in order, then move past it
                below = sorted(key for key in self._held if key[0] == sender and key[1] <= last_dropped)
                ready.extend(self._held.pop(key) for key in below)
                seq = last_dropped + 1
            while (sender, seq) in self._held:
                ready.append(self._held.pop((sender, seq)))
                seq += 1
            self._next_seq[sender] = seq
        return ready


@contextlib.contextmanager
def delivering(
    sink: Any, callbacks: Sequence[Callback], call_id: int, drain_s: float, tick: Callable[[], None] | None = None
) -> Iterator[None]:
    """Deliver a call's messages to ``callbacks`` while the block runs (nothing to do without callbacks);
    ``tick()`` after every pull."""
    pump = MessagePump(sink, callbacks, call_id, tick).start() if callbacks else None
    try:
        yield
    finally:
        if pump is not None:
            pump.stop(drain_s)
