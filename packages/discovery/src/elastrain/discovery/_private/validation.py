"""Argument checks shared by the discovery classes. Each error says what to change."""

from __future__ import annotations

import math


def check_positive(name: str, value: object, *, integer: bool = False) -> None:
    """Reject bools, non-numbers, NaN, infinities and values <= 0."""
    expected = "a positive integer" if integer else "a positive number"
    if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)):
        raise ValueError(f"{name} must be {expected}, got {value!r} ({type(value).__name__}).")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be {expected}, got {value!r}; pass a value greater than 0.")


def check_slot_count(host: str, slots: object, *, source: str) -> None:
    if not isinstance(host, str) or not host:
        raise ValueError(f"{source}: host names must be non-empty strings, got {host!r}.")
    if isinstance(slots, bool) or not isinstance(slots, int) or slots < 0:
        raise ValueError(f"{source}: slots for host {host!r} must be an integer >= 0, got {slots!r}.")


def check_cooldown_range(cooldown_range: object) -> tuple[float, float] | None:
    """Validate ``cooldown_range=(lo, hi)`` seconds; ``None`` means blacklisted hosts never return."""
    if cooldown_range is None:
        return None
    if not isinstance(cooldown_range, (tuple, list)) or len(cooldown_range) != 2:
        raise ValueError(f"cooldown_range must be a pair (lo, hi) of seconds, or None; got {cooldown_range!r}.")
    lo, hi = cooldown_range
    check_positive("cooldown_range lower bound", lo)
    check_positive("cooldown_range upper bound", hi)
    if lo > hi:
        raise ValueError(
            f"cooldown_range=({lo}, {hi}) has its lower bound above its upper bound; pass (lo, hi) with lo <= hi."
        )
    return float(lo), float(hi)
