"""Argument checks for the executor. Each error says what to change."""

from __future__ import annotations

import math


def check_positive(name: str, value: object, *, integer: bool = False) -> None:
    expected = "a positive integer" if integer else "a positive number"
    if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)):
        raise ValueError(f"{name} must be {expected}, got {value!r} ({type(value).__name__}).")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be {expected}, got {value!r}; pass a value greater than 0.")
