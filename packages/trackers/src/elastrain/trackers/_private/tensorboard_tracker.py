"""TensorBoard: event files per run, with every metric, world size and resets as scalars and events as text.

Written with tensorboardX (the ``tensorboard`` extra: protobuf and numpy, no TensorFlow and no torch); TensorBoard
reads them as its own.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from elastrain.trackers._private.extras import require
from elastrain.trackers._private.tracker import Event, Point, RunInfo

LOG_DIR_ENV = "ELASTRAIN_TENSORBOARD_DIR"
DEFAULT_LOG_DIR = "runs"  # torch.utils.tensorboard's default too


class TensorBoardTracker:
    """Runs as TensorBoard event files under ``log_dir`` (default: ``ELASTRAIN_TENSORBOARD_DIR``, else ./runs),
    one folder per run: ``<name>-<run id>``."""

    name = "tensorboard"

    def __init__(self, log_dir: str | os.PathLike[str] | None = None) -> None:
        require("tensorboardX", "tensorboard", "TensorBoard")
        self.log_dir = Path(log_dir or os.environ.get(LOG_DIR_ENV) or DEFAULT_LOG_DIR)

    def run_dir(self, run: RunInfo) -> Path:
        safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", run.name)[:80]
        return self.log_dir / f"{safe}-{run.id[:12]}"

    def open(self, run: RunInfo) -> TensorBoardRun:
        from tensorboardX import SummaryWriter

        writer = SummaryWriter(logdir=str(self.run_dir(run)), flush_secs=5)
        params = "\n".join(f"- {k}: {v}" for k, v in run.params.items())
        writer.add_text("run", f"{run.name} ({run.id})\n\n{params}", 0)
        return TensorBoardRun(writer)


class TensorBoardRun:
    def __init__(self, writer: Any) -> None:
        self.writer = writer

    def metrics(self, points: Sequence[Point]) -> None:
        for point in points:
            step = point.step if point.step is not None else 0
            for name, value in point.values.items():
                self.writer.add_scalar(name, value, step, walltime=point.time_ms / 1000)

    def world_size(self, size: int, resets: int, step: int | None, time_ms: int) -> None:
        at = step if step is not None else 0
        self.writer.add_scalar("world_size", size, at, walltime=time_ms / 1000)
        self.writer.add_scalar("resets", resets, at, walltime=time_ms / 1000)

    def event(self, event: Event) -> None:
        at = event.step if event.step is not None else 0
        self.writer.add_text(f"events/{event.kind}", event.text, at, walltime=event.time_ms / 1000)

    def end(self, status: str, detail: str | None) -> None:
        self.writer.add_text("status", status + (f": {detail}" if detail else ""), 0)
        self.writer.close()
