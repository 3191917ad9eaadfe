"""The sync's transfer measured: ``torch.distributed.broadcast`` of a 100M-parameter state with Adam over N real
CPU processes (gloo), as the sync at a reset runs it (the state's tensors one after another, from rank 0).

On one machine every "link" is a memory copy through the same cores, so this sets the model's constants (the
time of one whole-state hop) rather than showing its shape: docs/scale.md has the model and its assumptions.
"""

from __future__ import annotations

import os
import socket
import statistics
import time
from typing import Any

PARAMETERS = 100_000_000
TENSORS = 12  # the state in pieces, as a model's layers and their two Adam moments travel
REPEATS = 3


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _member(rank: int, size: int, port: int, parameters: int, results: Any) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size)
    # Weights and Adam's two moments: 3 float32 tensors' worth per parameter, in TENSORS pieces.
    piece = 3 * parameters // TENSORS
    state = [torch.full((piece,), float(rank == 0)) for _ in range(TENSORS)]
    samples = []
    for _ in range(REPEATS):
        dist.barrier()
        started = time.perf_counter()
        for tensor in state:
            dist.broadcast(tensor, 0)
        dist.barrier()
        samples.append(time.perf_counter() - started)
    assert all(float(t[-1]) == 1.0 for t in state), "every rank holds rank 0's state"
    if rank == 0:
        results.put(statistics.median(samples))
    dist.destroy_process_group()


def broadcast_seconds(size: int, parameters: int = PARAMETERS) -> float:
    """Median time to broadcast the state of ``parameters`` parameters with Adam from rank 0 to ``size`` ranks."""
    import torch.multiprocessing as mp

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    context = mp.get_context("spawn")
    results = context.SimpleQueue()
    port = _free_port()
    processes = [context.Process(target=_member, args=(rank, size, port, parameters, results)) for rank in range(size)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(600)
        if process.exitcode != 0:
            raise RuntimeError(f"a broadcast member exited with {process.exitcode}")
    return float(results.get())


if __name__ == "__main__":
    for n in (2, 4, 8):
        print(n, round(broadcast_seconds(n), 3), flush=True)
