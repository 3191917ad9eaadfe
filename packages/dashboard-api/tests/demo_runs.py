"""Runs like the demo's, recorded through elastrain-state's public API (``RunTracker``): for the page test and
the documentation's screenshots (``nox -s screenshots``).

The finished run is the demo's story: 2 workers (elastic 1 to 3) report loss, accuracy and epoch every 5 steps;
the worker of rank 1 crashes after step 50, the survivor goes on alone (reset 1), a replacement joins at step 60
(reset 2), and the run finishes at step 150. Host names and pids are made up, as on a small cluster.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from elastrain.state import RunTracker

REPORT_EVERY = 5
CRASH_DETAIL = "The actor died unexpectedly before finishing this task (worker exit code 1)."
TRACE = """Traceback (most recent call last):
  File "train.py", line 88, in loop
    loss = F.cross_entropy(outputs, targets)
  File "torch/nn/functional.py", line 3494, in cross_entropy
    return torch._C._nn.cross_entropy_loss(input, target, weight, reduction, ignore_index, label_smoothing)
RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 15.77 GiB total capacity)"""


@dataclass
class Recorded:
    """What a run was given, to check the page against."""

    tracker: RunTracker
    steps: list[int] = field(default_factory=list)  # every step reported, in order
    values: dict[int, dict[str, float]] = field(default_factory=dict)  # what each step reported
    reset_steps: list[int] = field(default_factory=list)
    crash_steps: list[int] = field(default_factory=list)
    crashed: list[dict[str, Any]] = field(default_factory=list)
    events: int = 0  # how many events the state actor records for it

    @property
    def run_id(self) -> str:
        return self.tracker.run_id


def _hex(text: str, length: int) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def worker(rank: int, host: str, pid: int, actor_id: str | None = None, gpus: tuple[str, ...] = ()) -> dict[str, Any]:
    return {
        "actor_id": actor_id or _hex(f"{host}/{pid}", 32), "world_rank": rank, "local_rank": 0, "node_rank": rank,
        "node_id": _hex(host, 56), "node_ip": f"10.0.0.{10 + int(host[-1], 36) % 200}", "hostname": host, "pid": pid,
        "gpu_ids": list(gpus),
    }  # fmt: skip


def _metrics(step: int, world_size: int) -> dict[str, float]:
    """Plausible curves: loss falls, accuracy rises, a little slower while the world is small."""
    wobble = 0.04 * math.sin(step / 3.0)
    loss = 2.3 * math.exp(-step / (38.0 if world_size > 1 else 46.0)) + 0.08 + wobble * 0.5
    accuracy = min(0.99, 1.0 - 0.9 * math.exp(-step / 30.0) + wobble * 0.2)
    return {"loss": round(loss, 4), "accuracy": round(accuracy, 4), "epoch": round(step / 15.0, 3)}


def _report(recorded: Recorded, steps: range, world_size: int, pace_s: float) -> None:
    for step in steps:
        values = _metrics(step, world_size)
        recorded.tracker.report_metrics(step=step, **values)
        recorded.steps.append(step)
        recorded.values[step] = values
        if pace_s:
            time.sleep(pace_s)  # only for screenshots: times a reader would expect, not all in one second


def finished_run(name: str = "digits-cnn", pace_s: float = 0, **tracker_options: Any) -> Recorded:
    """The demo's run, ended FINISHED: 4 events before the end (world, crash, reset to 1, reset to 2) and one end."""
    tracker = RunTracker(name, min_workers=1, max_workers=3, **tracker_options)
    recorded = Recorded(tracker)
    first, second, spare = worker(0, "trainer-a", 4242), worker(1, "trainer-b", 5151), worker(1, "trainer-c", 6060)
    tracker.start([first, second])
    _report(recorded, range(0, 51, REPORT_EVERY), 2, pace_s)
    tracker.worker_exited(second, "CRASHED", CRASH_DETAIL)
    recorded.crash_steps.append(50)
    recorded.crashed.append(second)
    tracker.set_workers([first], world_size=1, resets=1)  # the survivor goes on at once
    recorded.reset_steps.append(50)
    _report(recorded, range(55, 61, REPORT_EVERY), 1, pace_s)
    tracker.set_workers([first, spare], world_size=2, resets=2)  # the replacement joins
    recorded.reset_steps.append(60)
    _report(recorded, range(65, 151, REPORT_EVERY), 2, pace_s)
    tracker.finish()
    # WORLD_SIZE 2, WORKER_EXITED, RESET + WORLD_SIZE 1, RESET + WORLD_SIZE 2, RUN_ENDED
    recorded.events = 7
    return recorded


def errored_run(name: str = "resnet50-imagenet", pace_s: float = 0, **tracker_options: Any) -> Recorded:
    """Four workers on GPUs; one is removed with its host at step 80, then rank 0 runs out of memory at step 140."""
    tracker = RunTracker(name, min_workers=2, max_workers=4, **tracker_options)
    recorded = Recorded(tracker)
    workers = [worker(rank, f"gpu-node-{rank + 1}", 7000 + rank, gpus=(str(rank % 2),)) for rank in range(4)]
    tracker.start(workers)
    _report(recorded, range(0, 81, 10), 4, pace_s)
    tracker.worker_exited(workers[3], "REMOVED", "its host gpu-node-4 went away")
    tracker.set_workers(workers[:3], world_size=3, resets=1)
    recorded.reset_steps.append(80)
    _report(recorded, range(90, 141, 10), 3, pace_s)
    tracker.fail(TRACE, rank=0)
    recorded.events = 5  # WORLD_SIZE, WORKER_EXITED, RESET, WORLD_SIZE, RUN_ENDED
    return recorded


def running_run(
    make_worker: Callable[[int], dict[str, Any]],
    name: str = "bert-finetune",
    pace_s: float = 0,
    **tracker_options: Any,
) -> Recorded:
    """Going on: three workers (``make_worker(rank)``: live actors, so that they read ALIVE), one crashed at step 40."""
    tracker = RunTracker(name, min_workers=2, max_workers=4, **tracker_options)
    recorded = Recorded(tracker)
    workers = [make_worker(rank) for rank in range(4)]
    tracker.start(workers)
    _report(recorded, range(0, 41, 4), 4, pace_s)
    tracker.worker_exited(workers[2], "CRASHED", "evicted: no heartbeat for 9.0 s")
    recorded.crash_steps.append(40)
    recorded.crashed.append(workers[2])
    survivors = [{**w, "world_rank": rank} for rank, w in enumerate([workers[0], workers[1], workers[3]])]
    tracker.set_workers(survivors, world_size=3, resets=1)
    recorded.reset_steps.append(40)
    _report(recorded, range(44, 97, 4), 3, pace_s)
    recorded.events = 4  # WORLD_SIZE, WORKER_EXITED, RESET, WORLD_SIZE
    return recorded


def recorded_in_full(actor: Any, recorded: Recorded) -> bool:
    """Whether the state actor holds every step and event sent (RunTracker sends without waiting)."""
    import ray

    metrics, events = ray.get([actor.get_metrics.remote(recorded.run_id), actor.get_events.remote(recorded.run_id)])
    return bool(
        metrics and events and metrics["steps"][-1:] == recorded.steps[-1:] and len(events["events"]) == recorded.events
    )
