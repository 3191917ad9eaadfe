"""Bounded retries under one overall deadline, with errors that never carry credentials."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import TypeVar

from elastrain.durable._private.errors import DurableError, StorageError, StorageTimeoutError
from elastrain.durable._private.location import redact

T = TypeVar("T")
logger = logging.getLogger("elastrain.durable")

# Errors that another attempt cannot fix.
_PERMANENT = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError, ValueError, TypeError)
_FIRST_BACKOFF_S = 0.2
_MAX_BACKOFF_S = 5.0


def with_retries(
    operation: Callable[[float], T],
    *,
    what: str,
    timeout_s: float,
    retries: int,
    secrets: Iterable[str] = (),
) -> T:
    """Call ``operation(time_left_s)`` until it succeeds, at most ``retries + 1`` times within ``timeout_s``.

    Permanent errors (missing files, permissions, bad arguments) and this package's own errors other than
    storage errors pass through at once; the rest are retried with backoff and end as a ``StorageError``.
    """
    deadline = time.monotonic() + timeout_s
    backoff = _FIRST_BACKOFF_S
    attempt = 0
    while True:
        attempt += 1
        left = deadline - time.monotonic()
        if left <= 0:
            raise StorageTimeoutError(f"Gave up {what}: its deadline of {timeout_s:.1f} s passed.")
        try:
            return operation(left)
        except _PERMANENT as error:
            cleaned = redact(str(error), secrets)
            if cleaned != str(error):  # the message carried a credential: the same error, without it
                raise type(error)(cleaned) from None
            raise
        except DurableError as error:
            if not isinstance(error, StorageError):
                raise
            last: BaseException = error
        except Exception as error:
            last = error
        message = redact(f"{type(last).__name__}: {last}", secrets)
        left = deadline - time.monotonic()
        if attempt > retries or left <= backoff:
            error_type: type[StorageError] = StorageError
            if isinstance(last, StorageError):
                error_type = type(last)
            elif isinstance(last, TimeoutError):
                error_type = StorageTimeoutError
            raise error_type(f"Gave up {what} after {attempt} attempt(s): {message}") from None
        logger.warning("Attempt %d %s failed (%s); retrying in %.1f s.", attempt, what, message, backoff)
        time.sleep(backoff)
        backoff = min(backoff * 2, _MAX_BACKOFF_S)
