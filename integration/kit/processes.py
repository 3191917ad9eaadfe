"""The worker processes a scenario injected faults into."""

from __future__ import annotations


def still_there(pid: int) -> bool:
    """Whether ``pid`` is a Ray worker still there (stopped or not): the process a freeze targeted."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return cmdline.read().startswith(b"ray::")
    except OSError:
        return False
