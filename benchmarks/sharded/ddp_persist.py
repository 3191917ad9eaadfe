"""Persist time of a whole (DDP) state: every rank writing its share through DCP, against rank 0 writing it all.

Each sample is a fresh world of N spawned processes (gloo on a TCPStore, no Ray: the elastic runtime is stood in
for, the state and both persistences are the real ones), each holding the same model and AdamW state. All ranks
commit together; the time runs from that commit to the checkpoint being committed in the store (every rank's
``flush()`` for the sharded persistence, rank 0's for ``StatePersistence``), on a SeaweedFS S3 server. The
world's first persisted commit (opening the store, forming the writers' group) is made and flushed before the
timed one.
"""

from __future__ import annotations

import datetime
import json
import multiprocessing
import os
import socket
import statistics
import time
from pathlib import Path
from typing import Any


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class _LocalJob:
    """The part of the elastic runtime a state talks to when it commits."""

    def __init__(self) -> None:
        self.users: list[Any] = []

    def hold(self, commits: int) -> None:
        pass

    def pending_update(self) -> int:
        return 0

    def add_group_user(self, user: Any) -> None:
        self.users.append(user)

    def report_event(self, kind: str, fields: dict[str, Any]) -> None:
        pass


def _member(rank: int, size: int, port: int, spec: dict[str, Any], out: str) -> None:
    import torch
    import torch.distributed as dist

    from elastrain.durable import ShardedStatePersistence, StatePersistence
    from elastrain.executor import elastic
    from elastrain.executor._private.elastic.worker import runtime

    runtime.install(_LocalJob())  # type: ignore[arg-type]
    store = dist.TCPStore("127.0.0.1", port, size, is_master=rank == 0, timeout=datetime.timedelta(seconds=120))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=size)
    torch.manual_seed(0)
    width, layers = spec["width"], spec["layers"]
    model = torch.nn.Sequential(*(torch.nn.Linear(width, width, bias=False) for _ in range(layers)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(4, width)).sum().backward()
    optimizer.step()  # Adam's moments exist: the state is weights plus two moments each
    state = elastic.TorchState(model, optimizer, step=0)
    kind = spec["kind"]
    options = spec["storage_options"]
    if kind == "sharded":
        persistence: Any = ShardedStatePersistence(spec["uri"], every=1, num_to_keep=1, storage_options=options)
    else:
        persistence = StatePersistence(spec["uri"], every=1, num_to_keep=1, storage_options=options)
    state.persist_with(persistence)
    flushes = kind == "sharded" or rank == 0  # rank 0 alone writes a StatePersistence
    # A first commit opens the store and, for the sharded one, forms its writers' group: once per world. The
    # second is the one timed, as every later persisted commit of a job is.
    state.commit()
    if flushes:
        state._book.persistence.flush(600)
    dist.barrier()
    started = time.perf_counter()
    state.commit()
    blocked = time.perf_counter() - started
    if flushes:
        state._book.persistence.flush(600)
    done = time.perf_counter() - started
    times = [None] * size
    dist.all_gather_object(times, (blocked, done))
    if rank == 0:
        Path(out).write_text(json.dumps({"blocked": max(t[0] for t in times), "persist": max(t[1] for t in times)}))
    dist.barrier()
    os._exit(0)  # the result is written: skip the interpreter's teardown of groups and writer threads


def _run_world(size: int, spec: dict[str, Any], folder: Path) -> dict[str, float]:
    context = multiprocessing.get_context("spawn")
    port = _free_port()
    out = folder / f"result-{spec['kind']}-{size}-{time.monotonic_ns()}.json"
    processes = [
        context.Process(target=_member, args=(rank, size, port, spec, str(out)), daemon=True) for rank in range(size)
    ]
    for process in processes:
        process.start()
    for process in processes:
        process.join(600)
        if process.is_alive():
            process.kill()
    if not out.exists():
        raise RuntimeError(f"A {spec['kind']} world of {size} wrote no result (a member failed).")
    result: dict[str, float] = json.loads(out.read_text())
    return result


def measure(
    sizes: tuple[int, ...], *, width: int, layers: int, repeats: int, s3: Any, bucket: str, folder: Path
) -> dict[str, Any]:
    """Median persist (and blocked) time per world size and kind, the kinds interleaved sample by sample."""
    state_bytes = width * width * layers * 4 * 3  # weights and AdamW's two moments, float32
    found: dict[str, Any] = {"state_mib": round(state_bytes / 2**20, 1), "sizes": {}}
    for size in sizes:
        samples: dict[str, list[dict[str, float]]] = {"sharded": [], "rank0": []}
        for index in range(repeats):
            for kind in ("sharded", "rank0") if index % 2 == 0 else ("rank0", "sharded"):
                spec = {
                    "kind": kind,
                    "width": width,
                    "layers": layers,
                    "uri": f"s3://{bucket}/ddp-{kind}-{size}-{index}",
                    "storage_options": s3.storage_options(),
                }
                samples[kind].append(_run_world(size, spec, folder))
        found["sizes"][size] = {
            kind: {key: statistics.median(s[key] for s in runs) for key in ("persist", "blocked")}
            | {"samples": [round(s["persist"], 3) for s in runs]}
            for kind, runs in samples.items()
        }
    return found
