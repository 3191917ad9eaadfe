"""Sync at a reset: ``TorchState`` bringing a ~100M-parameter model with Adam state to a newcomer.

Two workers of a static ``RayExecutor`` job form a gloo group. Rank 0 has trained one step (Adam state exists)
and committed; rank 1 is a newcomer (no optimizer state yet). Measured in the same job, interleaved:

- baseline: ``torch.distributed.broadcast`` of every tensor of the model's ``state_dict`` and the optimizer's
  state from rank 0, into tensors rank 1 already holds (what a survivor's sync compares with) and, for the
  newcomer's, into optimizer-state tensors it allocates first (a newcomer has none);
- elastrain, newcomer: the sync a reset runs (commit counts, handlers, tensors in place, then the commit on
  every rank), the first time, when rank 1 must allocate its optimizer state;
- elastrain, survivor: the same sync again, when every tensor is already there.

Both workers first touch and free 3 GiB: on a VM, memory the guest never used before costs several times more
to fault in than memory it already backs, which would charge whichever variant ran first; a training process
that has run for a while is in the second state.

Peak memory: each worker's peak RSS during the sync (``VmHWM`` after resetting it) against the bytes of its
model plus optimizer state. A worker keeps one committed copy (model + optimizer), so about 2× is expected.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

LAYERS = 6
WIDTH = 4096  # 6 x (4096 x 4096 + 4096) = 100.7M parameters
ROUNDS = 3


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


def worker() -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from elastrain.executor import elastic, init_process_group
    from elastrain.executor._private.elastic import runtime

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
    state = elastic.TorchState(model, optimizer, step=1)
    if rank == 0:
        state._book.commits = 1
    # The sync a reset runs, on a group this job formed itself (no elastic driver here).
    runtime.install(runtime.Runtime(None, f"w{rank}", None))  # type: ignore[arg-type]
    tensors_bytes = sum(t.nbytes for t in model.state_dict().values())

    def optimizer_tensors() -> list[Any]:
        return [v for entry in optimizer.state.values() for v in entry.values() if isinstance(v, torch.Tensor)]

    baseline_targets: list[Any] = []

    def baseline() -> None:
        for tensor in [*model.state_dict().values(), *baseline_targets]:
            dist.broadcast(tensor, 0)

    def allocating_baseline() -> None:
        fresh = [torch.empty_like(t) if rank else t for t in baseline_targets]
        for tensor in [*model.state_dict().values(), *fresh]:
            dist.broadcast(tensor, 0)

    results: dict[str, list[float]] = {"broadcast": [], "broadcast_allocating": [], "newcomer": [], "survivor": []}
    memory: dict[str, float] = {}
    for round_ in range(ROUNDS):
        if round_ == 0:
            rss_before = _rss_kib("VmRSS")
            _reset_peak()
            results["newcomer"].append(_timed(lambda: state._synchronize()))
            peak = _rss_kib("VmHWM")
            memory = {"peak_kib": peak, "before_kib": rss_before}
            baseline_targets = optimizer_tensors()  # every rank holds them now: the baseline's receive buffers
            tensors_bytes += sum(t.nbytes for t in baseline_targets)
        else:
            results["survivor"].append(_timed(lambda: state._synchronize()))
        results["broadcast"].append(_timed(baseline))
        results["broadcast_allocating"].append(_timed(allocating_baseline))
    runtime.install(None)
    return {
        "rank": rank,
        "parameters": sum(p.numel() for p in model.parameters()),
        "model_and_optimizer_bytes": tensors_bytes,
        "seconds": {name: statistics.median(values) for name, values in results.items()},
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
    return {
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
