"""What the elastic-training tests share: hosts, a small model and its batches, hard crashes on cue, a recorder
of the workers' messages that drives discovery, and the executor they run on.

Workers pickle these functions by value (`ship_by_value` below), as they do a test module's own.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from elastrain.discovery import StaticHostDiscovery
from elastrain.executor import RayExecutor
from elastrain_testutils.ray_testing import ship_by_value

HOSTS = {f"node:host-{n}": 100 for n in range(1, 6)}
BATCH = 12  # split evenly over 1, 2, 3 or 4 workers
FEATURES = 6


def batch_for(step: int) -> tuple[Any, Any]:
    """The global batch of ``step``: the same on every worker and in the reference run."""
    import torch

    generator = torch.Generator().manual_seed(1000 + step)
    inputs = torch.randn(BATCH, FEATURES, generator=generator)
    return inputs, inputs.sum(dim=1, keepdim=True) * 0.5 + 1.0


def make_model() -> Any:
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))


def crash_if_marked(crash_dir: str | None, rank: int, step: int) -> None:
    """Exit hard, once, where the test left a ``crash-<rank>-<step>`` file."""
    if crash_dir is None:
        return
    marker = os.path.join(crash_dir, f"crash-{rank}-{step}")
    if os.path.exists(marker):
        os.remove(marker)
        os._exit(1)


def last_step(steps: int | str) -> int:
    """``steps``, or the number in the stop file named by it once the test has written it."""
    if isinstance(steps, int):
        return steps
    try:
        return int(Path(steps).read_text())
    except (FileNotFoundError, ValueError):
        return 1_000_000


class Recorder:
    """Collects the workers' messages; applies discovery changes when a condition on them first holds, and once
    the plan is through and a step ran at ``final_size``, writes ``stop_file`` (a step a few steps ahead)."""

    def __init__(
        self,
        discovery: StaticHostDiscovery | None = None,
        plan: list[tuple[Any, str | None]] | None = None,
        stop_file: Path | None = None,
        final_size: int = 0,
        stop_at: Callable[[dict[str, Any]], int] = lambda m: int(m["step"]) + 6,
    ):
        self.discovery = discovery
        self.plan = list(plan or [])
        self.stop_file = stop_file
        self.final_size = final_size
        self.stop_at = stop_at
        self.messages: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def __call__(self, message: dict[str, Any]) -> None:
        with self.lock:
            self.messages.append(message)
            if self.plan and self.plan[0][0](message):
                _, hosts = self.plan.pop(0)
                if hosts is not None:  # None: only wait for the condition
                    self.discovery.set_hosts(hosts)
            elif (
                self.stop_file is not None
                and not self.plan
                and message["event"] == "step"
                and message["size"] == self.final_size
                and not self.stop_file.exists()
            ):
                self.stop_file.write_text(str(self.stop_at(message)))

    def events(self, event: str) -> list[dict[str, Any]]:
        return [m for m in self.messages if m["event"] == event]


def elastic_executor(discovery: StaticHostDiscovery, **kwargs: Any) -> RayExecutor:
    settings = RayExecutor.create_settings(timeout_s=60, discovery=discovery, discovery_interval_s=0.05)
    kwargs.setdefault("elastic_timeout", 60)
    return RayExecutor(settings, override_discovery=False, cpus_per_worker=0.25, **kwargs)


ship_by_value(sys.modules[__name__])
