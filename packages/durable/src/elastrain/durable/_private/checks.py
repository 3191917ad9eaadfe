"""Argument checks shared by the store: each failure says what to change."""

from __future__ import annotations

import os


def check_options(
    num_to_keep: int | None, score_attribute: str | None, score_order: str, timeout_s: float, retries: int
) -> None:
    if num_to_keep is not None and (isinstance(num_to_keep, bool) or not isinstance(num_to_keep, int)):
        raise TypeError(f"num_to_keep must be a positive int or None (keep all), got {num_to_keep!r}.")
    if num_to_keep is not None and num_to_keep < 1:
        raise ValueError(f"num_to_keep must be at least 1 (or None to keep all), got {num_to_keep}.")
    if score_attribute is not None and (not isinstance(score_attribute, str) or not score_attribute):
        raise ValueError(f"score_attribute must be a metric name, got {score_attribute!r}.")
    if score_order not in ("max", "min"):
        raise ValueError(f"score_order must be 'max' or 'min', got {score_order!r}.")
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be positive, got {timeout_s!r}.")
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise ValueError(f"retries must be a non-negative int, got {retries!r}.")


def check_writable(path: str, what: str) -> None:
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as error:
        raise PermissionError(f"Cannot create {what} {path!r} ({error.strerror}); choose a writable folder.") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise PermissionError(f"{what.capitalize()} {path!r} is not writable; choose a writable folder.")
