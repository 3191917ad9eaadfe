"""A deterministic elastic training job whose final weights are known in advance.

Each step's batch depends only on the step; each rank takes a shard of it and gradients are summed, so every
step's update is the same whatever the world size. A job that survived any number of failures and resizes must
therefore end with exactly the weights of :func:`reference`: nothing committed was lost, nothing applied twice.
"""

from __future__ import annotations

import os
import time
from typing import Any

W_TRUE = (1.0, -2.0, 3.0, 0.5)
BATCH = 8
LR = 0.05
MOMENTUM = 0.9


def make_model() -> tuple[Any, Any]:
    import torch

    model = torch.nn.Linear(4, 1, bias=False, dtype=torch.float64)
    torch.nn.init.zeros_(model.weight)
    return model, torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)


def step_batch(step: int) -> tuple[Any, Any]:
    import torch

    generator = torch.Generator().manual_seed(step)
    inputs = torch.randn(BATCH, 4, generator=generator, dtype=torch.float64)
    return inputs, inputs @ torch.tensor(W_TRUE, dtype=torch.float64)


def reference(steps: int) -> list[float]:
    """The weights after ``steps`` steps on one process, with no failure."""
    model, optimizer = make_model()
    for step in range(steps):
        inputs, targets = step_batch(step)
        optimizer.zero_grad()
        ((model(inputs).squeeze(1) - targets) ** 2).sum().div(BATCH).backward()
        optimizer.step()
    return weights_of(model)


def weights_of(model: Any) -> list[float]:
    return [float(v) for v in model.weight.detach().flatten()]


def train(
    steps: int,
    *,
    step_sleep_s: float = 0.02,
    persistence: Any = None,
    ballast_bytes: int = 0,
    crash_dir: str | None = None,
    stop_file: str | None = None,
) -> dict[str, Any]:
    """Runs on every worker. Every rank sends ``{step, size, rank, pid, node, resets, t}`` after each step.

    ``persistence``: an elastrain-durable ``StatePersistence`` (or anything with its hook). ``ballast_bytes``
    makes each persisted snapshot that much bigger, so uploads take a while. ``crash_dir``: a file named
    ``crash-<rank>-<step>`` there makes that rank exit hard at that step, once (the file is removed first).
    ``stop_file``: once it exists, the step number in it replaces ``steps`` (whoever writes it leaves a margin
    above the current step, so every rank reads it before getting there).
    """
    import ray
    import torch.distributed as dist

    from elastrain.executor import elastic, send

    model, optimizer = make_model()
    state = elastic.TorchState(model=model, optimizer=optimizer, step=0, resets=0, ballast=b"\0" * ballast_bytes)
    if persistence is not None:
        state.persist_with(persistence)
    state.register_reset_callbacks([lambda: setattr(state, "resets", state.resets + 1)])
    node = ray.get_runtime_context().get_node_id()
    first_step: list[int] = []

    @elastic.run
    def loop(state: elastic.TorchState) -> dict[str, Any]:
        if not first_step:
            first_step.append(int(state.step))

        def last_step() -> int:
            if stop_file is not None and os.path.exists(stop_file):
                with open(stop_file) as reader:
                    return int(reader.read())
            return steps

        while state.step < last_step():
            rank, size = dist.get_rank(), dist.get_world_size()
            if crash_dir is not None:
                marker = os.path.join(crash_dir, f"crash-{rank}-{state.step}")
                if os.path.exists(marker):
                    os.remove(marker)
                    os._exit(1)
            inputs, targets = step_batch(state.step)
            optimizer.zero_grad()
            shard = ((model(inputs[rank::size]).squeeze(1) - targets[rank::size]) ** 2).sum().div(BATCH)
            shard.backward()
            for parameter in model.parameters():
                dist.all_reduce(parameter.grad)
            optimizer.step()
            state.step += 1
            send(
                {
                    "step": int(state.step),
                    "size": size,
                    "rank": rank,
                    "pid": os.getpid(),
                    "node": node,
                    "resets": int(state.resets),
                    "t": time.time(),
                }
            )
            time.sleep(step_sleep_s)
            state.commit()
        if persistence is not None:
            persistence.flush(timeout=120)
        return {"weights": weights_of(model), "first_step": first_step[0], "pid": os.getpid()}

    result: dict[str, Any] = loop(state)
    return result
