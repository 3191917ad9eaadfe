"""Hosts taken out of service after failures, each for a cooldown that grows with every failure."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from elastrain.discovery._private.validation import check_cooldown_range

# Jitter spreads the return of hosts that failed together; it adds up to this fraction of the base delay.
_JITTER_FRACTION = 0.25


@dataclass
class _Entry:
    times_blacklisted: int
    returns_at: float | None  # clock time at which the cooldown ends; None while blacklisted for good


class Blacklist:
    """Blacklisted hosts with exponential-backoff cooldowns.

    With ``cooldown_range=(lo, hi)``, the n-th blacklisting of a host (n = 0, 1, ...) keeps it out for
    ``min(hi, lo * 2**n + jitter)`` seconds, where jitter is uniform in ``[0, lo * 2**n / 4]``; then the host may
    return. With ``cooldown_range=None`` a blacklisted host never returns. A host blacklisted again while its
    cooldown runs keeps its current cooldown: one failure seen by several workers counts once.
    """

    def __init__(
        self,
        cooldown_range: tuple[float, float] | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self.cooldown_range = check_cooldown_range(cooldown_range)
        self._clock = clock
        self._rng = rng or random.Random()  # noqa: S311 - jitter, not cryptography
        self._entries: dict[str, _Entry] = {}
        self._lock = threading.Lock()

    def add(self, host_id: str) -> float | None:
        """Blacklist ``host_id``; return its cooldown in seconds, or ``None`` when it is out for good."""
        now = self._clock()
        with self._lock:
            entry = self._entries.get(host_id)
            if entry is not None and _is_active(entry, now):
                return None if entry.returns_at is None else entry.returns_at - now
            times = 0 if entry is None else entry.times_blacklisted
            cooldown = self._cooldown(times)
            self._entries[host_id] = _Entry(
                times_blacklisted=times + 1, returns_at=None if cooldown is None else now + cooldown
            )
            return cooldown

    def is_blacklisted(self, host_id: str) -> bool:
        with self._lock:
            entry = self._entries.get(host_id)
            return entry is not None and _is_active(entry, self._clock())

    def active(self) -> dict[str, float | None]:
        """``{host_id: seconds until it may return, or None for never}`` for hosts blacklisted now."""
        now = self._clock()
        with self._lock:
            return {
                host_id: None if entry.returns_at is None else entry.returns_at - now
                for host_id, entry in self._entries.items()
                if _is_active(entry, now)
            }

    def times_blacklisted(self, host_id: str) -> int:
        with self._lock:
            entry = self._entries.get(host_id)
            return 0 if entry is None else entry.times_blacklisted

    def _cooldown(self, previous_times: int) -> float | None:
        if self.cooldown_range is None:
            return None
        lo, hi = self.cooldown_range
        base = lo * 2.0 ** min(previous_times, 64)  # the cap keeps the power finite for long-lived hosts
        return min(hi, base + self._rng.uniform(0.0, base * _JITTER_FRACTION))


def _is_active(entry: _Entry, now: float) -> bool:
    return entry.returns_at is None or now < entry.returns_at
