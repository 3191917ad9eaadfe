"""Which messages that workers ``send()`` count as metrics for run observers, and what of them.

A message counts when it holds at least one number besides ``step``: an ``int`` or ``float`` (numpy's too; a
``bool`` is not a number here). Its numbers, under string keys, are its values; its other entries (text,
lists, dicts, tensors, None) are left out. ``step``, when present and not None, must be a non-negative integer,
or the whole message is not a metric report (a wrong step would put the values at the wrong place).
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from typing import Any


def metric_report(message: Mapping[str, Any]) -> tuple[int | None, dict[str, float]] | None:
    """``(step, values)`` of a message that counts as metrics, else None."""
    step = message.get("step")
    if step is not None and (isinstance(step, bool) or not isinstance(step, numbers.Integral) or step < 0):
        return None
    values = {}
    for key, value in message.items():
        if key == "step" or not isinstance(key, str) or isinstance(value, bool) or not isinstance(value, numbers.Real):
            continue
        try:
            values[key] = float(value)
        except (OverflowError, ValueError, TypeError):  # an int too large for a float, or a Real that refuses
            continue
    if not values:
        return None
    return (None if step is None else int(step)), values
