"""The handle ``save_async`` and ``restore_async`` return: a future that event loops can also await."""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable, Generator
from typing import Any

from elastrain.durable._private.checkpoint import Checkpoint


class CheckpointFuture:
    """The checkpoint once committed (or restored). ``result(timeout)`` blocks; ``await future`` does not."""

    def __init__(self, future: concurrent.futures.Future[Checkpoint]) -> None:
        self._future = future
        self.observed = False  # whether the caller has seen the outcome (then close() need not raise it again)

    def result(self, timeout: float | None = None) -> Checkpoint:
        try:
            return self._future.result(timeout)
        finally:
            self.observed = self._future.done()

    def exception(self, timeout: float | None = None) -> BaseException | None:
        error = self._future.exception(timeout)
        self.observed = True  # reached only once done
        return error

    def done(self) -> bool:
        return self._future.done()

    def add_done_callback(self, callback: Callable[[CheckpointFuture], Any]) -> None:
        self._future.add_done_callback(lambda _: callback(self))

    def __await__(self) -> Generator[Any, None, Checkpoint]:
        try:
            return (yield from asyncio.wrap_future(self._future).__await__())
        finally:
            self.observed = self._future.done()

    def __repr__(self) -> str:
        state = "pending" if not self.done() else "failed" if self._future.exception() else "done"
        return f"<CheckpointFuture {state}>"
