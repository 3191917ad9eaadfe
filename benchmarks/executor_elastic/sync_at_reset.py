"""Sync at a reset: ``TorchState`` bringing a ~100M-parameter model with Adam state to a newcomer.

Two workers of a static ``RayExecutor`` job form a gloo group. Rank 0 has trained one step (Adam state exists)
and committed; rank 1 is a newcomer (no optimizer state yet). Measured in the same job, ``ROUNDS`` rounds, each
one pairing every variant with its baseline back to back (which of the pair goes first alternates):

- elastrain, newcomer: the sync a reset runs (commit counts, handlers, tensors in place, then the commit on
  every rank) when rank 1 must allocate its optimizer state: before each such round rank 1 drops its optimizer
  state and both ranks make a fresh ``TorchState``, as a replacement process would have;
- baseline for it: ``torch.distributed.broadcast`` of every tensor of the model's ``state_dict`` and of the
  optimizer's state from rank 0, rank 1 receiving the optimizer's into tensors it allocates first;
- elastrain, survivor: the same sync again, when every tensor is already there and both ranks are at their last
  commit with the same count, as survivors are at a reset raised from a commit (``at_commit``): they receive
  into their live tensors and keep their committed copies;
- baseline for it: the same broadcasts into the tensors rank 1 already holds.

Both sides of a pair allocate (and fault in) the same amount of fresh memory, which on a VM costs several times
more than touching memory already backed and varies from run to run; pairing them keeps that variation out of
the ratios, which are medians of the per-round ratios.

Both workers first touch and free 3 GiB: on a VM, memory the guest never used before costs several times more
to fault in than memory it already backs, which would charge whichever variant ran first; a training process
that has run for a while is in the second state.

Peak memory: each worker's peak RSS during the sync (``VmHWM`` after resetting it) against the bytes of its
model plus optimizer state. A worker keeps one committed copy (model + optimizer), so about 2× is expected.
"""

from __future__ import annotations

import functools
import gc
import statistics
import time
from typing import Any

LAYERS = 6
WIDTH = 4096  # 6 x (4096 x 4096 + 4096) = 100.7M parameters
ROUNDS = 5


def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")  # resets VmHWM to the current RSS


def _timed(fn: Any) -> float:
    import torch.distributed as dist

    dist.barrier()
    start = time.perf_counter()
    fn()
    dist.barrier()
    return time.perf_counter() - start


def broadcast_shapes(tensors: list[Any], rank: int) -> list[tuple[Any, Any]]:
    """Rank 0's optimizer-state shapes and dtypes, on every rank (what a receiver allocates)."""
    import torch.distributed as dist

    box = [[(tuple(t.shape), t.dtype) for t in tensors] if rank == 0 else None]
    dist.broadcast_object_list(box, 0)
    return box[0]  # type: ignore[return-value]


def worker() -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from elastrain.executor import elastic, init_process_group
    from elastrain.executor._private.elastic.worker import runtime

    init_process_group(timeout_s=600)
    torch.set_num_threads(1)
    warm = torch.ones(3 * 2**30, dtype=torch.uint8)  # see the module's docstring
    del warm
    rank = dist.get_rank()
    model = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    if rank == 0:  # the survivor: it trained, so Adam's moments exist
        model(torch.ones(2, WIDTH)).sum().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    # The sync a reset runs, on a group this job formed itself (no elastic driver here).
    runtime.install(runtime.Runtime(None, f"w{rank}", None))  # type: ignore[arg-type]
    model_bytes = sum(t.nbytes for t in model.state_dict().values())

    def optimizer_tensors() -> list[Any]:
        return [v for entry in optimizer.state.values() for v in entry.values() if isinstance(v, torch.Tensor)]

    def fresh_state() -> Any:
        if rank == 1:
            optimizer.state.clear()  # a replacement process has no optimizer state yet
        gc.collect()
        made = elastic.TorchState(model, optimizer, step=1)
        if rank == 0:  # the source: its reset came from a commit, which leaves it there
            made._book.commits, made._book.at_commit = 1, True
        return made

    def survivor_sync(state: Any) -> None:
        state._book.at_commit = True  # both ranks: their reset came from a commit
        state._synchronize()

    source_tensors = optimizer_tensors() if rank == 0 else []
    shapes = broadcast_shapes(source_tensors, rank)

    def broadcast_into(targets: list[Any]) -> None:
        for tensor in [*model.state_dict().values(), *targets]:
            dist.broadcast(tensor, 0)

    def allocating_baseline() -> None:
        targets = source_tensors if rank == 0 else [torch.empty(shape, dtype=dtype) for shape, dtype in shapes]
        broadcast_into(targets)

    results: dict[str, list[float]] = {"broadcast": [], "broadcast_allocating": [], "newcomer": [], "survivor": []}
    memory: dict[str, float] = {}

    def pair(first: tuple[str, Any], second: tuple[str, Any], swap: bool) -> None:
        for name, fn in (second, first) if swap else (first, second):
            results[name].append(_timed(fn))

    for round_ in range(ROUNDS):
        state = fresh_state()
        if round_ == 0:
            rss_before = _rss_kib("VmRSS")
            _reset_peak()
            results["newcomer"].append(_timed(state._synchronize))
            memory.update(peak_kib=_rss_kib("VmHWM"), before_kib=rss_before)
            results["broadcast_allocating"].append(_timed(allocating_baseline))
        else:
            pair(("newcomer", state._synchronize), ("broadcast_allocating", allocating_baseline), round_ % 2 == 1)
        held = optimizer_tensors()  # every rank holds them now: the in-place baseline's receive buffers
        survivor = functools.partial(survivor_sync, state)
        pair(("survivor", survivor), ("broadcast", functools.partial(broadcast_into, held)), round_ % 2 == 1)
        del held, state, survivor
    tensors_bytes = model_bytes + sum(t.nbytes for t in optimizer_tensors())
    runtime.install(None)
    return {
        "rank": rank,
        "parameters": sum(p.numel() for p in model.parameters()),
        "model_and_optimizer_bytes": tensors_bytes,
        "seconds": {name: statistics.median(values) for name, values in results.items()},
        "ratios": {
            "newcomer": statistics.median(
                n / b for n, b in zip(results["newcomer"], results["broadcast_allocating"], strict=True)
            ),
            "survivor": statistics.median(
                s / b for s, b in zip(results["survivor"], results["broadcast"], strict=True)
            ),
        },
        "samples": results,
        "peak_rss_bytes": memory["peak_kib"] * 1024,
        "rss_before_bytes": memory["before_kib"] * 1024,
    }


def measure() -> dict[str, Any]:
    import ray

    from elastrain.executor import RayExecutor

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        settings = RayExecutor.create_settings(timeout_s=120)
        with RayExecutor(settings, num_workers=2, cpus_per_worker=1) as executor:
            executor.start()
            ranks = executor.run(worker)
    finally:
        ray.shutdown()
    newcomer = ranks[1]
    seconds = {name: max(r["seconds"][name] for r in ranks) for name in ranks[0]["seconds"]}
    # Rank 1 receives, so its round times (which both ranks share through the barriers) give the ratios.
    return {
        "ratio_newcomer": newcomer["ratios"]["newcomer"],
        "ratio_survivor": newcomer["ratios"]["survivor"],
        "samples": newcomer["samples"],
        "parameters": newcomer["parameters"],
        "broadcast_s": seconds["broadcast"],
        "broadcast_allocating_s": seconds["broadcast_allocating"],
        "sync_newcomer_s": seconds["newcomer"],
        "sync_survivor_s": seconds["survivor"],
        "model_and_optimizer_bytes": newcomer["model_and_optimizer_bytes"],
        "peak_rss_ratio_newcomer": newcomer["peak_rss_bytes"] / newcomer["model_and_optimizer_bytes"],
        "peak_rss_ratio_source": ranks[0]["peak_rss_bytes"] / ranks[0]["model_and_optimizer_bytes"],
    }


if __name__ == "__main__":
    import json

    print(json.dumps(measure(), indent=2))
