"""A worker's traceback as the driver shows it: plain text, once, without Ray's machinery.

Ray formats a failed actor call for a terminal: a coloured ``ray::Worker.run() (pid=..., ip=..., actor_id=...,
repr=...)`` line in place of ``Traceback (most recent call last):``, and the ``^^^^`` markers of the frames it
hides left behind. :func:`clean_traceback` turns that back into a Python traceback of the user's frames, which
reads the same in a terminal, a log file and a test report.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# Ray's header line of each exception in the chain, which stands where Python's "Traceback ..." line would.
_RAY_HEADER = re.compile(r"^\S*ray::\S+\(\)\s+\(pid=(?P<pid>\d+), ip=(?P<ip>[^,)]+)")
_TRACEBACK_HEADER = "Traceback (most recent call last):"
# Frames that are the transport, not the failure: Ray's own (Ray hides most already) and the worker actor's
# entry point that calls the user's function.
_HIDDEN_FRAMES = (
    "ray/worker.py",
    "ray/_private/",
    "ray/util/tracing/",
    "ray/_raylet.pyx",
    "elastrain/executor/_private/worker.py",
)


@dataclass(frozen=True)
class RemoteTraceback:
    """A cleaned worker traceback and where it ran (``pid``/``ip`` are None when Ray did not say)."""

    text: str
    pid: int | None
    ip: str | None


def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text)


def clean_traceback(text: str) -> RemoteTraceback:
    """``text`` (Ray's formatting of a failed call, or a plain traceback) as a plain Python traceback."""
    pid: int | None = None
    ip: str | None = None
    out: list[str] = []
    in_hidden_frame = False
    for line in strip_ansi(text).strip("\n").splitlines():
        header = _RAY_HEADER.match(line)
        if header:
            if pid is None:
                pid, ip = int(header["pid"]), header["ip"]
            out.append(_TRACEBACK_HEADER)
            in_hidden_frame = False
        elif line.startswith("  File "):
            in_hidden_frame = any(marker in line for marker in _HIDDEN_FRAMES)
            if not in_hidden_frame:
                out.append(line)
        elif in_hidden_frame and line.startswith("    "):
            continue  # the hidden frame's source line or markers
        elif _is_marker_line(line) and not _follows_source_line(out):
            continue  # markers whose source line Ray dropped
        else:
            in_hidden_frame = False
            out.append(line)
    # Drop a header left without frames (Ray keeps only the error line of some chained exceptions).
    kept = [
        line
        for line, after in itertools.pairwise([*out, ""])
        if line != _TRACEBACK_HEADER or after.startswith("  File ")
    ]
    return RemoteTraceback("\n".join(kept), pid, ip)


def _is_marker_line(line: str) -> bool:
    stripped = line.strip()
    return bool(stripped) and set(stripped) <= set("^~")


def _follows_source_line(out: list[str]) -> bool:
    """Whether the last kept line is a frame's source line (the line after its ``  File`` line)."""
    return len(out) >= 2 and out[-2].startswith("  File ") and out[-1].startswith("    ")
