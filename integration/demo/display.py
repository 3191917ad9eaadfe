"""What the demo prints while it trains: one live progress line on a terminal (a line per epoch in a log file),
the planned crash announced before it happens, world-size changes as they happen, and real warnings and
errors, while Ray's and the executor's notices about the crash the demo announced stay out.
"""

from __future__ import annotations

import contextlib
import io
import logging
import sys
import threading
from collections.abc import Iterator
from typing import Any, TextIO

from tqdm import tqdm

# What Ray's driver prints (on stdout, tagged "(raylet)") when a worker process dies, and what the executor
# logs then: the death as the driver learns it, and the group's failure as the survivors report it.
RAY_DEATH_NOTICE = "A worker died or was killed while executing a task"
EXECUTOR_DEATH_NOTICES = ("Worker %s on host %s failed: %s", "Group %s failed (%s); forming a new one.")
BAR_FORMAT = "{percentage:3.0f}%|{bar:24}| epoch {n:.1f}/{total:.0f} [{elapsed}<{remaining}]  {desc}"


class Display:
    """Takes the workers' reports (an executor callback) and keeps them for the summary."""

    def __init__(self, epochs: int, crash_step: int, pace_s: float, out: TextIO) -> None:
        self.epochs = epochs
        self.crash_step = crash_step
        self.pace_s = pace_s  # how long a worker pauses after each step
        self.out = out
        self.live = out.isatty()
        self.reports: list[dict[str, Any]] = []
        self.crashed_at: float | None = None  # when the planned crash happened, on the workers' clock
        self._lock = threading.RLock()
        self._expected: dict[str, int] = {}  # notices of the announced crash still to hold back, by kind
        self._last_line: dict[str, Any] | None = None  # the last report printed as a line (not live)
        self._bar: tqdm[Any] | None = None  # the live line, from the first report on (its clock starts there)

    def __call__(self, message: dict[str, Any]) -> None:
        report = {**message, **message.get("world", {})}  # the bookkeeping, flattened for the summary
        with self._lock:
            previous = self.reports[-1] if self.reports else None
            self.reports.append(report)
            if previous is not None and report["size"] != previous["size"]:
                self.line(
                    f"Step {report['step']}: world size {previous['size']} -> {report['size']}{self._why(report)}"
                )
            if self.live:
                if self._bar is None:
                    self._bar = tqdm(total=self.epochs, file=self.out, dynamic_ncols=True, bar_format=BAR_FORMAT)
                self._bar.n = min(report["epoch"], self.epochs)
                self._bar.set_description_str(_figures(report), refresh=False)
                self._bar.refresh()
            elif int(report["epoch"]) > int(self._last_line["epoch"] if self._last_line else 0):
                self._print_report(report)
            if report["step"] == self.crash_step and report["size"] > 1 and report["resets"] == 0:
                self._announce_crash(report)

    def _announce_crash(self, report: dict[str, Any]) -> None:
        self.crashed_at = report["time"] + self.pace_s  # rank 1 exits once its step's pause is over
        self._expected = dict.fromkeys([RAY_DEATH_NOTICE, *EXECUTOR_DEATH_NOTICES], 1)
        self.line(
            f"Step {report['step']}: crashing the worker of rank 1 now, on purpose (os._exit, as if the OOM killer "
            f"took it); {_survivors(report['size'] - 1)} should go on at once and a replacement join within seconds."
        )

    def _why(self, report: dict[str, Any]) -> str:
        if self.crashed_at is None:
            return ""
        grew = report["size"] > self.reports[-2]["size"]
        what = "a replacement joined" if grew else survivors_went_on(report["size"])
        return f" ({what}, {report['time'] - self.crashed_at:.2f} s after the crash)"

    def _print_report(self, report: dict[str, Any]) -> None:
        self._last_line = report
        epoch = min(report["epoch"], self.epochs)
        self.line(f"epoch {epoch:4.1f}/{self.epochs}  {_figures(report)}")

    def line(self, text: str) -> None:
        """A line of its own: above the live progress line on a terminal."""
        with self._lock:
            if self.live:
                tqdm.write(text, file=self.out)
            else:
                self.out.write(text + "\n")
                self.out.flush()

    def expected(self, notice: str) -> bool:
        """Whether ``notice`` (one of the kinds above) is the announced crash's, and so is held back."""
        with self._lock:
            if self._expected.get(notice, 0) > 0:
                self._expected[notice] -= 1
                return True
            return False

    def close(self) -> None:
        with self._lock:
            if self._bar is not None:
                self._bar.close()
            elif self.reports and self.reports[-1] is not self._last_line:
                self._print_report(self.reports[-1])


def _survivors(size: int) -> str:
    return "the survivor" if size == 1 else f"the {size} survivors"


def survivors_went_on(size: int) -> str:
    return "the survivor went on alone" if size == 1 else f"the {size} survivors went on"


def _figures(report: dict[str, Any]) -> str:
    return (
        f"step {report['step']:>4}  loss {report['loss']:.3f}  accuracy {report['accuracy']:6.1%}  "
        f"world size {report['size']}  resets {report['resets']}"
    )


class _HoldBackRayNotice(io.TextIOBase):
    """sys.stdout while the demo runs: whole lines to the display, less Ray's notice of the announced crash."""

    def __init__(self, display: Display) -> None:
        self._display = display
        self._pending = ""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self._pending += text
        *lines, self._pending = self._pending.split("\n")
        for line in lines:
            if not (RAY_DEATH_NOTICE in line and self._display.expected(RAY_DEATH_NOTICE)):
                self._display.line(line)
        return len(text)

    def flush(self) -> None:
        self._display.out.flush()

    def close(self) -> None:
        if self._pending:
            self._display.line(self._pending)
            self._pending = ""
        super().close()


class _ExecutorLog(logging.Handler):
    """The executor's warnings and errors as lines of the display, less its notice of the announced crash."""

    def __init__(self, display: Display) -> None:
        super().__init__(logging.WARNING)
        self._display = display

    def emit(self, record: logging.LogRecord) -> None:
        if record.msg in EXECUTOR_DEATH_NOTICES and self._display.expected(record.msg):
            return
        self._display.line(f"{record.levelname.lower()}: {record.getMessage()}")


@contextlib.contextmanager
def showing(display: Display) -> Iterator[Display]:
    """Route stdout and elastrain's log through ``display`` while the job runs."""
    handler = _ExecutorLog(display)
    logger = logging.getLogger("elastrain")
    logger.addHandler(handler)
    logger.propagate = False
    stdout, held = sys.stdout, _HoldBackRayNotice(display)
    sys.stdout = held
    try:
        yield display
    finally:
        sys.stdout = stdout
        held.close()
        logger.removeHandler(handler)
        logger.propagate = True
        display.close()
