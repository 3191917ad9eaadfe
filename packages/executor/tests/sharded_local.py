"""Worlds of real processes, without Ray, for ShardedTorchState's reset protocol.

Each member is a spawned process running :func:`member`: it forms gloo groups on a fresh ``TCPStore`` per
world, trains an FSDP2 model and commits every step. At a scripted step some members exit hard; the others catch
the failed collective, leave the group and form the next world with the ranks the script gives them, as the
elastic runtime would, then let the state resync. Only the runtime's control plane (the driver and rendezvous
actor) is stood in for; the state, its copies, the ring and every transfer are the real ones.
"""

from __future__ import annotations

import datetime
import json
import os
import time
from pathlib import Path
from typing import Any

BATCH = 12
FEATURES = 6


def make_model() -> Any:
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 10), torch.nn.Tanh(), torch.nn.Linear(10, 3))


def batch_for(step: int) -> tuple[Any, Any]:
    import torch

    generator = torch.Generator().manual_seed(1000 + step)
    inputs = torch.randn(BATCH, FEATURES, generator=generator)
    return inputs, torch.stack([inputs.sum(1), inputs[:, 0], -inputs[:, 1]], dim=1)


def reference(steps: int) -> dict[str, Any]:
    """The failure-free run in one process: the whole batch per step."""
    import torch

    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    for step in range(steps):
        inputs, labels = batch_for(step)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(inputs), labels).backward()
        optimizer.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def build(mesh: Any) -> Any:
    import torch
    from torch.distributed.fsdp import fully_shard

    model = make_model()
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=0.01)


def hsdp_shape(size: int) -> tuple[int, int]:
    """Replicas of 2 shards where the world is even (HSDP), one group of all ranks where it is not."""
    return (size // 2, 2) if size % 2 == 0 else (1, size)


class LocalJob:
    """The part of the elastic runtime a state talks to, for one member."""

    def __init__(self, node: int) -> None:
        from types import SimpleNamespace

        self.generation = 0
        self.high_water = 0
        self.role = "newcomer"
        self.commits = 0
        self.member = SimpleNamespace(node_rank=node)
        self.start_over_on_state_loss = False
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.users: list[Any] = []

    def hold(self, commits: int) -> None:
        self.commits = commits

    def report_event(self, kind: str, fields: dict[str, Any]) -> None:
        self.events.append((kind, fields))

    def pending_update(self) -> int:
        return 0

    def add_group_user(self, user: Any) -> None:
        self.users.append(user)

    def state_started_over(self) -> None:
        self.high_water = self.commits = 0


# A survivor waits this long in a collective whose peer neither answers nor closes its connections. A peer that
# left a failed world must close them (tests check that no survivor's failure was this timeout).
COLLECTIVE_TIMEOUT_S = 30


class FolderPersistence:
    """The sharded persistence protocol on a local folder (what elastrain-durable's ShardedStatePersistence
    implements on any store): ``<folder>/<name>/part-NNNNN/...``, committed by a ``COMMITTED`` file last."""

    sharded = True

    def __init__(self, folder: str, every: int) -> None:
        self.folder, self.every = Path(folder), every

    def due(self, commits: int) -> bool:
        return commits % self.every == 0

    def begin(self, step: int) -> str:
        name = f"step-{step:06d}"
        (self.folder / name).mkdir(parents=True, exist_ok=True)
        return name

    def upload_part(self, name: str, part: str, local_dir: str) -> list[dict[str, Any]]:
        import shutil

        shutil.copytree(local_dir, self.folder / name / part)
        return [{"path": f"{part}/{p.name}"} for p in Path(local_dir).iterdir()]

    def commit(self, name: str, parts: list[Any], *, step: int, metrics: Any, index_files: dict[str, bytes]) -> None:
        for relative, data in index_files.items():
            (self.folder / name / relative).write_bytes(data)
        (self.folder / name / "COMMITTED").write_text(json.dumps({"step": step, "parts": parts}))

    def latest(self) -> str | None:
        committed = sorted(p.parent.name for p in self.folder.glob("*/COMMITTED"))
        return committed[-1] if committed else None

    def download(self, name: str, local_dir: str) -> int:
        import shutil

        shutil.copytree(self.folder / name, local_dir)
        return int(json.loads((self.folder / name / "COMMITTED").read_text())["step"])


def form(port: int, rank: int, size: int) -> None:
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S)
    store = dist.TCPStore("127.0.0.1", port, size, is_master=rank == 0, timeout=datetime.timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=size, timeout=timeout)


def member(worker: int, script: dict[str, Any], out: str) -> None:
    """One process. ``script["worlds"]`` lists each world as ``[port, [workers in rank order], last step]``;
    ``script["exits"]`` maps a worker to the step after whose commit it exits hard (after ``linger_s``): the
    others fail in the next step's collectives, roll back and form the next world."""
    import torch
    import torch.distributed as dist

    from elastrain.executor import elastic
    from elastrain.executor._private.elastic.worker import runtime

    started = time.monotonic()
    job = LocalJob(node=worker)
    runtime.install(job)  # type: ignore[arg-type]
    mesh_shape = hsdp_shape if script.get("hsdp") else None
    state = elastic.ShardedTorchState(build, mesh_shape=mesh_shape, redundancy_every=script.get("every", 1), step=0)
    if "persist" in script:
        state.persist_with(FolderPersistence(script["persist"]["folder"], every=script["persist"]["every"]))
    exit_at = script.get("exits", {}).get(str(worker), -1)
    result: dict[str, Any] = {"worker": worker, "loads": [], "failures": []}
    for index, (port, members, last) in enumerate(script["worlds"]):
        if worker not in members:
            continue
        rank, size = members.index(worker), len(members)
        job.generation = index + 1
        if dist.is_initialized():
            for user in job.users:
                user.unbind()
            dist.destroy_process_group()
        form(port, rank, size)
        try:
            state._synchronize()
        except Exception as error:
            import traceback

            result["error"] = f"{type(error).__name__}: {error}"
            result["traceback"] = traceback.format_exc()
            break
        result["loads"].append({**state.last_load, "at_s": round(time.monotonic() - started, 2)})
        model, optimizer = state.model, state.optimizer
        try:
            while state.step < last:
                inputs, labels = batch_for(state.step)
                share = BATCH // size
                mine = slice(rank * share, (rank + 1) * share)
                optimizer.zero_grad()
                torch.nn.functional.mse_loss(model(inputs[mine]), labels[mine]).backward()
                optimizer.step()
                state.step += 1
                state.commit()
                job.high_water = max(job.high_water, state.commit_count)
                if state.step == exit_at:
                    time.sleep(script.get("linger_s", 0.0))  # lets the copy in flight arrive, or not
                    os._exit(0)
        except RuntimeError as error:  # a peer died: what elastic.run does on a collective failure
            result["failures"].append(str(error).splitlines()[0][:200])
            state._roll_back()
        # As when elastic.run's training function returns or raises: nothing holds the old world's model (and
        # through its mesh the old group) any more, so the group's connections close with it.
        del model, optimizer
    if "error" not in result:
        state._flush_all_ranks()
        full = {}
        with torch.no_grad():
            for name, tensor in state.model.state_dict().items():
                full[name] = tensor.full_tensor().tolist()
        result["weights"] = full
        result["step"] = state.step
    result["events"] = job.events
    Path(out).write_text(json.dumps(result))
    dist.destroy_process_group()


def run_script(script: dict[str, Any], folder: Path, timeout_s: float = 120.0) -> dict[int, dict[str, Any]]:
    """Start every worker the script names, wait for all, and return each survivor's result by worker."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    workers = sorted({w for _, members, _ in script["worlds"] for w in members})
    processes = {}
    for worker in workers:
        out = folder / f"worker-{worker}.json"
        processes[worker] = context.Process(target=member, args=(worker, script, str(out)), daemon=True)
        processes[worker].start()
    deadline = time.monotonic() + timeout_s
    for process in processes.values():
        process.join(max(deadline - time.monotonic(), 0.1))
    for process in processes.values():
        if process.is_alive():
            process.kill()
            process.join(5)
    results = {}
    for worker in workers:
        out = folder / f"worker-{worker}.json"
        if out.exists():
            results[worker] = json.loads(out.read_text())
    return results
