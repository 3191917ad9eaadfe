"""elastrain's side of the torchft comparison: a DDP job loses a worker and takes a replacement back in.

Two workers (``min_workers=1, max_workers=2``) train a Linear(64, 64) with SGD in ``TorchState``, a 50 ms
sleep per step standing in for compute and a commit every step, as in ``torchft_baseline.py``: gradients
averaged with ``all_reduce`` (as torchft's baseline does through ``manager.allreduce``), or with the model
wrapped in ``elastic.DistributedDataParallel``. Rank 1 exits hard at step 30. Measured:

- crash → survivors' next step: from the crash to the survivor's first step after it;
- replacement started → first step in sync: from the driver starting the replacement actor (its "Starting
  worker" log record) to that worker's first step in the larger group, after the sync brought it the state;
- whether a survivor crashed (its process must go on to the end).
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any

CRASH_STEP = 30
STEP_S = 0.05
HIDDEN = 64


def train(steps: int, crash_marker: str, use_ddp: bool) -> int:
    import torch
    import torch.distributed as dist

    from elastrain.executor import context, elastic, init_process_group, send

    init_process_group()
    torch.manual_seed(0)
    model: torch.nn.Module = torch.nn.Linear(HIDDEN, HIDDEN)
    if use_ddp:
        model = elastic.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    state = elastic.TorchState(model, optimizer, step=0)

    @elastic.run
    def loop(state: elastic.TorchState) -> int:
        while state.step < steps:
            rank = dist.get_rank()
            if rank == 1 and state.step == CRASH_STEP and not os.path.exists(crash_marker):
                Path(crash_marker).write_text(str(time.time()))
                os._exit(1)
            optimizer.zero_grad()
            time.sleep(STEP_S)  # compute stands in before the step's gradient allreduce
            model(torch.randn(8, HIDDEN)).pow(2).mean().backward()
            if not use_ddp:
                for parameter in model.parameters():
                    dist.all_reduce(parameter.grad)
                    parameter.grad /= dist.get_world_size()
            optimizer.step()
            state.step += 1
            send(
                {
                    "t": time.time(),
                    "size": dist.get_world_size(),
                    "step": state.step,
                    "worker": context().run_id,
                    "pid": os.getpid(),
                }
            )
            state.commit()
        return os.getpid()

    return int(loop(state))


class _Starts(logging.Handler):
    """When the driver started each worker (its own log record, timed by the logging module)."""

    def __init__(self) -> None:
        super().__init__()
        self.started: dict[str, float] = {}

    def emit(self, record: logging.LogRecord) -> None:
        if record.msg == "Starting worker %s on host %s.":
            self.started[str(record.args[0])] = record.created  # type: ignore[index]


def measure(use_ddp: bool = False) -> dict[str, Any]:
    import ray

    from elastrain.executor import RayExecutor

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    starts = _Starts()
    driver_log = logging.getLogger("elastrain.executor")
    driver_log.addHandler(starts)
    driver_log.setLevel(logging.INFO)
    steps: list[dict[str, Any]] = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            marker = os.path.join(tmp, "crashed")
            settings = RayExecutor.create_settings(timeout_s=60)
            with RayExecutor(settings, min_workers=1, max_workers=2, cpus_per_worker=1) as executor:
                executor.start()
                pids = executor.run(train, args=[CRASH_STEP + 80, marker, use_ddp], callbacks=[steps.append])
            crashed_at = float(Path(marker).read_text())
    finally:
        driver_log.removeHandler(starts)
        ray.shutdown()
    before = {m["worker"] for m in steps if m["t"] < crashed_at}
    after = [m for m in steps if m["t"] > crashed_at]
    survivors = {m["worker"] for m in after} & before
    newcomer = next(m for m in after if m["worker"] not in before)
    survivor_pids = {m["pid"] for m in steps if m["worker"] in survivors}
    return {
        "recovery_s": after[0]["t"] - crashed_at,
        "replacement_to_first_step_s": newcomer["t"] - starts.started[newcomer["worker"]],
        "ddp_survivor_crashed": not survivor_pids <= set(pids),
    }


if __name__ == "__main__":
    import json
    import sys

    print(json.dumps(measure(use_ddp="--ddp" in sys.argv), indent=2))
