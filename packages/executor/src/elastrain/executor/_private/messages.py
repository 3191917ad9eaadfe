"""Worker-to-driver messages: a small actor that buffers what workers ``send()``, and the driver-side pump."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

logger = logging.getLogger("elastrain.executor")

Callback = Callable[[dict[str, Any]], None]
# How long one pull waits for a message; bounds how late the pump notices that it should stop.
_PULL_WAIT_S = 0.5


# (call id, sender: the worker's stable id, sequence number within the call, message)
Envelope = tuple[int, str, int, dict[str, Any]]


class MessageSink:
    """Ray actor (async, zero CPU) holding messages until the driver pulls them.

    An async actor may run one caller's ``put``s out of order, so each message carries its sequence number
    and the driver restores the order.
    """

    def __init__(self) -> None:
        self._messages: list[Envelope] = []
        self._arrived = asyncio.Event()

    async def put(self, envelope: Envelope) -> None:
        self._messages.append(envelope)
        self._arrived.set()

    async def pull(self, wait_s: float) -> list[Envelope]:
        """Everything buffered, waiting up to ``wait_s`` for the first message."""
        if not self._messages:
            try:
                await asyncio.wait_for(self._arrived.wait(), wait_s)
            except TimeoutError:
                return []
        messages, self._messages = self._messages, []
        self._arrived.clear()
        return messages


class MessagePump:
    """Delivers messages from a sink to callbacks on a driver thread while a call runs.

    A callback that raises stops delivery; :meth:`stop` then re-raises its error on the calling thread.
    """

    def __init__(self, sink: Any, callbacks: Sequence[Callback], call_id: int) -> None:
        self._sink = sink
        self._callbacks = list(callbacks)
        self._call_id = call_id
        self._next_seq: dict[str, int] = {}
        self._held: dict[tuple[str, int], dict[str, Any]] = {}  # arrived ahead of an earlier message
        self._stopping = threading.Event()
        self._error: BaseException | None = None
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
        if self._error is not None:
            raise self._error

    def _pump(self) -> None:
        import ray

        while True:
            stopping = self._stopping.is_set()
            try:
                batch = ray.get(self._sink.pull.remote(0.0 if stopping else _PULL_WAIT_S))
            except Exception as error:  # the sink died with the executor: nothing more will arrive
                logger.debug("Message sink unavailable: %s", error)
                return
            try:
                for message in self._in_order(batch):
                    for callback in self._callbacks:
                        callback(message)
            except BaseException as error:
                self._error = error
                return
            if stopping and not batch:
                return

    def _in_order(self, batch: list[Envelope]) -> list[dict[str, Any]]:
        """The messages of this call that are next in their worker's sequence; holds the rest back."""
        ready = []
        for call_id, sender, seq, message in batch:
            if call_id == self._call_id:  # a message a worker sent late in an earlier call is dropped
                self._held[(sender, seq)] = message
        for sender in sorted({sender for sender, _ in self._held}):
            seq = self._next_seq.get(sender, 0)
            while (sender, seq) in self._held:
                ready.append(self._held.pop((sender, seq)))
                seq += 1
            self._next_seq[sender] = seq
        return ready


@contextlib.contextmanager
def delivering(sink: Any, callbacks: Sequence[Callback], call_id: int, drain_s: float) -> Iterator[None]:
    """Deliver a call's messages to ``callbacks`` while the block runs (nothing to do without callbacks)."""
    pump = MessagePump(sink, callbacks, call_id).start() if callbacks else None
    try:
        yield
    finally:
        if pump is not None:
            pump.stop(drain_s)
