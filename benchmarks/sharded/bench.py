"""Sharded elastic state (FSDP2, CPU/gloo): what a sharded checkpoint costs training, recovery from a lost worker,
loading at a new world size, and memory, against plain PyTorch DCP in the same run.

Worlds of real processes without Ray (spawned, a fresh ``TCPStore`` per world, gloo), as
``packages/executor/tests/sharded_local.py`` runs them: a stand-in for the elastic runtime's control plane
(``LocalJob``) is installed, and everything else (``ShardedTorchState``, its copies, the buddy ring, the transfers,
``ShardedStatePersistence`` on a local folder) is the real thing. The model is a stack of ``Linear`` layers
(33.6M parameters; with AdamW 403 MB of tensors), each process runs torch with one thread.

- training blocked by a sharded save (4 ranks): ``state.commit()`` due for ``ShardedStatePersistence(every=1)``
  (it copies the rank's chunks to CPU and hands them to a background thread) vs
  ``torch.distributed.checkpoint.async_save`` of ``get_state_dict(model, optimizer)`` of the same model (time
  until it returns; ``get_state_dict`` itself is not counted). Each is timed after a training step, on every
  rank between barriers (the slowest rank's time), and waited for (``_flush_all_ranks``, the future) before the
  next (the commit's wait for the buddy copy of the commit before is counted; after that checkpoint and a step
  it has arrived).
  ``ROUNDS`` rounds after one warm-up, the order alternating; once with ``redundancy_every=1``, once with 0.
- worker lost (4 → 3 ranks): one rank exits hard (``os._exit``) right after a commit (1 s later, so its buddy
  copy has arrived); ours is timed from the moment the survivors catch the failed collective (the first one)
  to the end of their first step in the new world (the last one): leaving the group, forming the next world
  (the stand-in forms it at once: no driver), the state's resync from memory, one step. The baseline is what
  Ray Train does, without Ray's own costs: the job's processes wrote a DCP checkpoint (``dcp.save``) at the
  same step; from the kill, the others are stopped (SIGKILL as soon as the dead one is seen), and 3 fresh
  processes import torch, form a group, build the FSDP model, ``dcp.load`` the local checkpoint, and step.
  ``REPEATS`` times each, in fresh processes, alternating.
- worker lost under HSDP (2 × 2, ``size_multiple=2``, no buddy copies): the same loss, timed the same way,
  for the untouched replica group, which goes on alone at 2 ranks with the chunks it holds; the lost rank's
  replica-group mate leaves (under ``size_multiple`` it would wait for a replacement). Against the same
  restart baseline, and against the 1-D recovery above.
- load at a new world size: a job at 2 or 3 ranks whose state is in nobody's memory loads the latest
  ``ShardedStatePersistence`` checkpoint written at 4 ranks (listing, download from the store on local disk,
  ``dcp.load`` resharded: the time of the state's persisted-load path) vs ``dcp.load`` +
  ``set_state_dict`` of the same checkpoint, copied to local disk beforehand, into the same built model.
- persist time of a whole (DDP) state at 2 and 4 ranks (``ddp_persist.py``): every rank writing its share
  through ``ShardedStatePersistence`` vs rank 0 writing it all through ``StatePersistence``, on a SeaweedFS S3
  server, from the commit to the checkpoint committed in the store.
- peak memory per rank (notes, like ``executor_elastic``'s): each rank's peak RSS (``VmHWM``, reset after the
  first sync) over 3 steps, each committed and checkpointed (the checkpoints written while training goes on),
  against its share of the weights + AdamW state: the whole RSS, and its growth above the RSS before the model
  was built; with ``redundancy_every=1`` and 0.
"""

from __future__ import annotations

import datetime
import functools
import json
import multiprocessing
import os
import shutil
import signal
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import ddp_persist

from benchlib import Row, parse_args, write_results
from elastrain_testutils.storage_servers import SeaweedS3

FULL = {"layers": 8, "width": 2048}  # 8 x (2048 x 2048 + 2048) = 33.6M parameters
QUICK = {"layers": 4, "width": 256}
BATCH = 8
WORLD = 4  # the save, the loss (4 -> 3) and the checkpoint the load reads
LOAD_SIZES = (2, 3)
DDP_SIZES = (2, 4)  # a whole (DDP) state persisted by every rank vs by rank 0 (ddp_persist.py)
ROUNDS = 5  # in-process rounds (save, load), after one warm-up round
REPEATS = 3  # process-level samples (worker lost)
LOST_AT_STEP = 3
LINGER_S = 1.0  # the lost rank exits this long after its last commit: its buddy copy arrives first
MEMORY_STEPS = 3
COLLECTIVE_TIMEOUT_S = 60


# -- what every process shares ----------------------------------------------------------------------------------


def build(mesh: Any, *, layers: int, width: int) -> Any:
    import torch
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4)


def train_step(model: Any, optimizer: Any, width: int, step: int) -> None:
    import torch

    generator = torch.Generator().manual_seed(1000 + step)
    inputs = torch.randn(BATCH, width, generator=generator)
    model(inputs).square().mean().backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def form(port: int, rank: int, size: int) -> None:
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", port, size, is_master=rank == 0, timeout=datetime.timedelta(seconds=120))
    timeout = datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=size, timeout=timeout)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def rss_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")  # VmHWM back to the current RSS


def local_state_bytes(model: Any, optimizer: Any) -> int:
    """This rank's share of the weights and the optimizer state (its chunks)."""
    import torch
    from torch.distributed.tensor import DTensor

    def local(tensor: Any) -> Any:
        return tensor.to_local() if isinstance(tensor, DTensor) else tensor

    total = sum(local(p).nbytes for p in model.parameters())
    for entry in optimizer.state.values():
        total += sum(local(v).nbytes for v in entry.values() if isinstance(v, torch.Tensor))
    return int(total)


class LocalJob:
    """The part of the elastic runtime a state talks to (a stand-in for its driver and rendezvous)."""

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


def install_job(node: int) -> LocalJob:
    from elastrain.executor._private.elastic.worker import runtime

    job = LocalJob(node)
    runtime.install(job)  # type: ignore[arg-type]
    return job


def run_world(target: Any, size: int, args: tuple[Any, ...], folder: Path, timeout_s: float = 600) -> list[Any]:
    """``size`` spawned processes running ``target(rank, size, *args, out)``; each one's JSON result by rank."""
    context = multiprocessing.get_context("spawn")
    outs = [folder / f"{target.__name__}-{rank}-{time.monotonic_ns()}.json" for rank in range(size)]
    processes = [
        context.Process(target=target, args=(rank, size, *args, str(outs[rank])), daemon=True) for rank in range(size)
    ]
    for process in processes:
        process.start()
    deadline = time.monotonic() + timeout_s
    for process in processes:
        process.join(max(deadline - time.monotonic(), 0.1))
    for process in processes:
        if process.is_alive():
            process.kill()
            process.join(5)
    return [json.loads(out.read_text()) if out.exists() else None for out in outs]


def progress(message: str) -> None:
    print(f"[sharded {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def write(out: str, result: dict[str, Any]) -> None:
    Path(out).write_text(json.dumps(result))


def finish(out: str, result: dict[str, Any]) -> None:
    """Write the result and end the process at once: a worker's groups and the state's background threads
    could hold it at interpreter exit (seen here: up to a minute), and nothing after the result is measured."""
    write(out, result)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# -- 1 and 4: training blocked by a sharded save; peak memory -----------------------------------------------------


def save_worker(rank: int, size: int, port: int, config: dict[str, Any], out: str) -> None:
    import gc

    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    from elastrain.durable import ShardedStatePersistence
    from elastrain.executor import elastic

    torch.set_num_threads(1)
    job = install_job(rank)
    model_config = config["model"]
    state = elastic.ShardedTorchState(
        functools.partial(build, **model_config), redundancy_every=config["every"], step=0
    )
    state.persist_with(ShardedStatePersistence(config["store"], every=1, num_to_keep=2))
    form(port, rank, size)
    job.generation = 1
    rss_before_build = rss_kib("VmRSS")
    state._synchronize()
    gc.collect()
    rss_after_sync = rss_kib("VmRSS")
    reset_peak()
    model, optimizer = state.model, state.optimizer
    for _ in range(MEMORY_STEPS):  # training as it runs: live objects, copies, a checkpoint written meanwhile
        train_step(model, optimizer, model_config["width"], state.step)
        state.step += 1
        state.commit()
    state._flush_all_ranks()
    peak_kib = rss_kib("VmHWM")
    state_bytes = local_state_bytes(model, optimizer)
    ward_bytes = state._shards.redundancy.memory_bytes()

    def ours() -> float:
        dist.barrier()
        started = time.perf_counter()
        state.step += 1
        state.commit()
        blocked = time.perf_counter() - started
        state._flush_all_ranks()
        dist.barrier()
        return blocked

    saves = 0

    def theirs() -> float:
        nonlocal saves
        saves += 1
        model_sd, optimizer_sd = get_state_dict(model, optimizer)
        dist.barrier()
        started = time.perf_counter()
        future = dcp.async_save(
            {"model": model_sd, "optimizer": optimizer_sd}, checkpoint_id=os.path.join(config["dcp"], f"s{saves}")
        )
        blocked = time.perf_counter() - started
        future.result()
        dist.barrier()
        return blocked

    samples: dict[str, list[float]] = {"commit": [], "async_save": []}
    for round_ in range(config["rounds"] + 1):
        pair = [("commit", ours), ("async_save", theirs)]
        for name, fn in reversed(pair) if round_ % 2 else pair:
            train_step(model, optimizer, model_config["width"], state.step)
            seconds = fn()
            if round_:  # the first round warms up
                samples[name].append(seconds)
    state._flush_all_ranks()
    finish(
        out,
        {
            "rank": rank,
            "samples": samples,
            "state_bytes": state_bytes,
            "ward_bytes": ward_bytes,
            "rss_before_build_bytes": rss_before_build * 1024,
            "rss_after_sync_bytes": rss_after_sync * 1024,
            "peak_rss_bytes": peak_kib * 1024,
            "parameters": sum(p.numel() for p in model.parameters()),
        },
    )


def measure_save(model_config: dict[str, Any], rounds: int, every: int, store: Path, scratch: Path) -> dict[str, Any]:
    dcp_dir = scratch / f"dcp-async-{every}"
    dcp_dir.mkdir()
    config = {"model": model_config, "rounds": rounds, "every": every, "store": str(store), "dcp": str(dcp_dir)}
    progress(f"save, redundancy_every={every}")
    ranks = run_world(save_worker, WORLD, (free_port(), config), scratch)
    shutil.rmtree(dcp_dir, ignore_errors=True)
    if any(r is None for r in ranks):
        raise RuntimeError(f"the save world (redundancy_every={every}) failed")
    # Training is synchronous: each round blocks it for its slowest rank's time.
    per_round = {
        name: [max(r["samples"][name][i] for r in ranks) for i in range(rounds)] for name in ranks[0]["samples"]
    }
    state_bytes = max(r["state_bytes"] for r in ranks)
    peak = max(r["peak_rss_bytes"] for r in ranks)
    growth = max(r["peak_rss_bytes"] - r["rss_before_build_bytes"] for r in ranks)
    steady = max(r["peak_rss_bytes"] - r["rss_after_sync_bytes"] for r in ranks)
    return {
        "commit_s": statistics.median(per_round["commit"]),
        "async_save_s": statistics.median(per_round["async_save"]),
        "samples": {name: [round(v, 4) for v in values] for name, values in per_round.items()},
        "state_bytes_per_rank": state_bytes,
        "peak_rss_mib": round(peak / 2**20),
        "peak_rss_over_state": round(peak / state_bytes, 2),
        "peak_rss_above_start_over_state": round(growth / state_bytes, 2),
        "peak_rss_above_first_sync_over_state": round(steady / state_bytes, 2),
        "rss_after_first_sync_mib": round(max(r["rss_after_sync_bytes"] for r in ranks) / 2**20),
        "ward_copies_mib": round(max(r["ward_bytes"] for r in ranks) / 2**20),
        "parameters": ranks[0]["parameters"],  # a DTensor parameter's numel() is the whole tensor's
    }


# -- 2: a worker lost ---------------------------------------------------------------------------------------------


def hsdp_pairs(size: int) -> tuple[int, int]:
    return size // 2, 2


def lost_worker(rank: int, size: int, ports: list[int], config: dict[str, Any], out: str) -> None:
    """elastrain: the last rank exits after its commit of ``LOST_AT_STEP``; the others go on at ``size - 1``.
    With ``config["hsdp"]``: a 2 × 2 HSDP mesh without buddy copies, and the lost rank's replica-group mate
    leaves too (under ``size_multiple=2`` it waits outside the group): the untouched replica group goes on."""
    import torch
    import torch.distributed as dist

    from elastrain.executor import elastic

    torch.set_num_threads(1)
    job = install_job(rank)
    model_config, width = config["model"], config["model"]["width"]
    hsdp = bool(config.get("hsdp"))
    state = elastic.ShardedTorchState(
        functools.partial(build, **model_config),
        mesh_shape=hsdp_pairs if hsdp else None,
        redundancy_every=0 if hsdp else 1,
        step=0,
    )
    form(ports[0], rank, size)
    job.generation = 1
    state._synchronize()
    model, optimizer = state.model, state.optimizer
    result: dict[str, Any] = {"rank": rank}
    caught = 0.0
    step_seconds: list[float] = []  # the steps before the loss, for scale
    try:
        while state.step < LOST_AT_STEP + 5:
            began = time.perf_counter()
            train_step(model, optimizer, width, state.step)
            step_seconds.append(time.perf_counter() - began)
            state.step += 1
            state.commit()
            job.high_water = max(job.high_water, state.commit_count)
            if rank == size - 1 and state.step == LOST_AT_STEP:
                time.sleep(LINGER_S)
                finish(out, {"rank": rank, "killed_at": time.time()})  # ends the process: the loss
    except RuntimeError as error:  # the lost peer's connections closed: what elastic.run catches
        caught = time.time()
        result["failure"] = str(error).splitlines()[0][:200]
        state._roll_back()
    if not caught:
        raise RuntimeError("no collective failed")
    if hsdp and rank == size - 2:
        finish(out, {"rank": rank, "held": True})  # ends the process: it would wait for a replacement
    del model, optimizer
    for user in job.users:
        user.unbind()
    dist.destroy_process_group()
    left = time.time()
    form(ports[1], rank, size - 2 if hsdp else size - 1)
    job.generation = 2
    formed = time.time()
    state._synchronize()
    synced = time.time()
    model, optimizer = state.model, state.optimizer
    train_step(model, optimizer, width, state.step)
    stepped = time.time()
    result.update(
        caught_at=caught,
        stepped_at=stepped,
        leave_s=left - caught,
        form_s=formed - left,
        sync_s=synced - formed,
        step_s=stepped - synced,
        steady_step_s=statistics.median(step_seconds[1:]),
        last_load={k: v for k, v in state.last_load.items() if k != "generation"},
    )
    state.step += 1
    state.commit()
    finish(out, result)


def measure_lost(model_config: dict[str, Any], scratch: Path, hsdp: bool = False) -> dict[str, Any]:
    progress(f"worker lost: elastrain{' (HSDP)' if hsdp else ''}")
    config = {"model": model_config, "hsdp": hsdp}
    ranks = run_world(lost_worker, WORLD, ([free_port(), free_port()], config), scratch)
    if any(r is None for r in ranks):
        raise RuntimeError(f"the worker-lost world failed: {ranks}")
    survivors = [r for r in ranks if "caught_at" in r]
    killed_at = next(r["killed_at"] for r in ranks if "killed_at" in r)
    caught = min(r["caught_at"] for r in survivors)
    return {
        "recovery_s": max(r["stepped_at"] for r in survivors) - caught,
        "kill_to_caught_s": caught - killed_at,
        "leave_s": max(r["leave_s"] for r in survivors),
        "form_s": max(r["form_s"] for r in survivors),
        "sync_s": max(r["sync_s"] for r in survivors),
        "step_s": max(r["step_s"] for r in survivors),
        "steady_step_s": max(r["steady_step_s"] for r in survivors),
        "load_path": survivors[0]["last_load"].get("path"),
        "lost_commits": max(r["last_load"].get("lost_commits", 0) for r in survivors),
        "received_mib": round(sum(r["last_load"].get("received_bytes", 0) for r in survivors) / 2**20, 1),
    }


def measure_lost_hsdp(model_config: dict[str, Any], scratch: Path) -> dict[str, Any]:
    return measure_lost(model_config, scratch, hsdp=True)


def plain_worker(rank: int, size: int, port: int, config: dict[str, Any], out: str) -> None:
    """The baseline's job before the loss: FSDP2 without elastrain, a DCP checkpoint at ``LOST_AT_STEP``."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(1)
    form(port, rank, size)
    model, optimizer = build(init_device_mesh("cpu", (size,)), **config["model"])
    step = 0
    while True:
        try:
            train_step(model, optimizer, config["model"]["width"], step)
        except RuntimeError:  # the lost peer: the driver stops this process (SIGKILL) once it sees the loss
            time.sleep(600)
        step += 1
        if step == LOST_AT_STEP:
            model_sd, optimizer_sd = get_state_dict(model, optimizer)
            dcp.save({"model": model_sd, "optimizer": optimizer_sd, "step": step}, checkpoint_id=config["checkpoint"])
            if rank == size - 1:
                time.sleep(LINGER_S)  # as ours: the loss comes a while after the checkpoint
                finish(out, {"rank": rank, "killed_at": time.time()})  # ends the process: the loss


def restart_worker(rank: int, size: int, port: int, config: dict[str, Any], out: str) -> None:
    """A restarted process: import torch, form the group, build, load the checkpoint, one step."""
    started = time.time()
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(1)
    imported = time.time()
    form(port, rank, size)
    formed = time.time()
    model, optimizer = build(init_device_mesh("cpu", (size,)), **config["model"])
    built = time.time()
    model_sd, optimizer_sd = get_state_dict(model, optimizer)  # AdamW's state initialized, to load into
    loaded_state = {"model": model_sd, "optimizer": optimizer_sd, "step": 0}
    dcp.load(loaded_state, checkpoint_id=config["checkpoint"])
    set_state_dict(model, optimizer, model_state_dict=model_sd, optim_state_dict=optimizer_sd)
    loaded = time.time()
    train_step(model, optimizer, config["model"]["width"], int(loaded_state["step"]))
    stepped = time.time()
    finish(
        out,
        {
            "rank": rank,
            "started_at": started,
            "stepped_at": stepped,
            "import_s": imported - started,
            "form_s": formed - imported,
            "build_s": built - formed,
            "load_s": loaded - built,
            "step_s": stepped - loaded,
            "loaded_step": int(loaded_state["step"]),
        },
    )


def measure_restart(model_config: dict[str, Any], scratch: Path) -> dict[str, Any]:
    """Ray Train's recovery, without Ray: on a worker's death stop every worker, start fresh ones, load, step."""
    progress("worker lost: restart from the DCP checkpoint")
    checkpoint = scratch / f"dcp-restart-{time.monotonic_ns()}"
    config = {"model": model_config, "checkpoint": str(checkpoint)}
    context = multiprocessing.get_context("spawn")
    outs = [scratch / f"plain-{rank}-{time.monotonic_ns()}.json" for rank in range(WORLD)]
    port = free_port()
    processes = [
        context.Process(target=plain_worker, args=(rank, WORLD, port, config, str(outs[rank])), daemon=True)
        for rank in range(WORLD)
    ]
    for process in processes:
        process.start()
    lost = processes[-1]
    lost.join(600)
    for process in processes[:-1]:  # the controller sees the death and stops the rest of the group
        if process.pid is not None and process.is_alive():
            os.kill(process.pid, signal.SIGKILL)
    seen_at = time.time()
    for process in processes:
        process.join(10)
    killed_at = json.loads(outs[-1].read_text())["killed_at"]
    ranks = run_world(restart_worker, WORLD - 1, (free_port(), config), scratch)
    shutil.rmtree(checkpoint, ignore_errors=True)
    if any(r is None for r in ranks):
        raise RuntimeError("the restarted world failed")
    return {
        "recovery_s": max(r["stepped_at"] for r in ranks) - killed_at,
        "kill_to_stopped_s": seen_at - killed_at,
        "stopped_to_started_s": min(r["started_at"] for r in ranks) - seen_at,
        **{key: max(r[key] for r in ranks) for key in ("import_s", "form_s", "build_s", "load_s", "step_s")},
        "loaded_step": ranks[0]["loaded_step"],
    }


# -- 3: load at a new world size ----------------------------------------------------------------------------------

_LOAD_SECONDS: list[float] = []


def load_worker(rank: int, size: int, port: int, config: dict[str, Any], out: str) -> None:
    import gc

    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    from elastrain.durable import ShardedStatePersistence
    from elastrain.executor import elastic

    class TimedState(elastic.ShardedTorchState):
        def _load_persisted(self, rank: int, high_water: int) -> bool:
            started = time.perf_counter()
            loaded = super()._load_persisted(rank, high_water)
            _LOAD_SECONDS.append(time.perf_counter() - started)
            return loaded

    torch.set_num_threads(1)
    job = install_job(rank)
    model_config = config["model"]
    persistence = ShardedStatePersistence(config["store"], every=10**9, num_to_keep=None)
    states: list[Any] = []

    def new_state() -> Any:
        return TimedState(functools.partial(build, **model_config), redundancy_every=0, step=0)

    form(port, rank, size)
    local = config["local_copy"]
    download_s = 0.0
    if rank == 0:  # the baseline's local copy (not in its time); for scale, how long one rank's download takes
        began = time.perf_counter()
        persistence.download(persistence.latest(), local)
        download_s = time.perf_counter() - began
    dist.barrier()

    def ours() -> float:
        """A job whose state is in nobody's memory: the reset loads the latest persisted checkpoint."""
        if states:  # the previous job's objects go, as its processes would
            states[-1].unbind()
            job.users.remove(states[-1])
            states.clear()
            gc.collect()
        state = new_state()
        state.persist_with(persistence)
        job.generation += 1
        state._synchronize()
        dist.barrier()
        states.append(state)
        if state.last_load.get("path") != "persisted":
            raise RuntimeError(f"expected a persisted load, got {state.last_load}")
        return _LOAD_SECONDS[-1]

    def theirs() -> float:
        model, optimizer = states[-1].model, states[-1].optimizer
        dist.barrier()
        started = time.perf_counter()
        model_sd, optimizer_sd = get_state_dict(model, optimizer)
        dcp.load({"model": model_sd, "optimizer": optimizer_sd}, checkpoint_id=local)
        set_state_dict(model, optimizer, model_state_dict=model_sd, optim_state_dict=optimizer_sd)
        seconds = time.perf_counter() - started
        dist.barrier()
        return seconds

    samples: dict[str, list[float]] = {"ours": [], "dcp_load": []}
    for round_ in range(config["rounds"] + 1):
        # The baseline loads into a built model: in odd rounds the previous round's, before ours builds anew.
        pair = [("dcp_load", theirs), ("ours", ours)] if round_ % 2 else [("ours", ours), ("dcp_load", theirs)]
        for name, fn in pair:
            seconds = fn()
            if round_:
                samples[name].append(seconds)
    finish(out, {"rank": rank, "samples": samples, "last_load": states[-1].last_load, "download_s": download_s})


def measure_load(model_config: dict[str, Any], rounds: int, size: int, store: Path, scratch: Path) -> dict[str, Any]:
    local = scratch / f"local-copy-{size}"
    config = {"model": model_config, "rounds": rounds, "store": str(store), "local_copy": str(local)}
    progress(f"load at {size} ranks")
    ranks = run_world(load_worker, size, (free_port(), config), scratch)
    shutil.rmtree(local, ignore_errors=True)
    if any(r is None for r in ranks):
        raise RuntimeError(f"the load world ({size} ranks) failed")
    per_round = {
        name: [max(r["samples"][name][i] for r in ranks) for i in range(rounds)] for name in ranks[0]["samples"]
    }
    return {
        "ours_s": statistics.median(per_round["ours"]),
        "dcp_load_s": statistics.median(per_round["dcp_load"]),
        "samples": {name: [round(v, 4) for v in values] for name, values in per_round.items()},
        "checkpoint": ranks[0]["last_load"].get("checkpoint"),
        "one_download_alone_s": round(ranks[0]["download_s"], 3),
    }


# -- the run ------------------------------------------------------------------------------------------------------


RESTART_PHASES = ("kill_to_stopped_s", "stopped_to_started_s", "import_s", "form_s", "build_s", "load_s", "step_s")


def main() -> None:
    args = parse_args(__doc__ or "")
    model_config = QUICK if args.quick else FULL
    repeats, rounds = (1, 2) if args.quick else (REPEATS, ROUNDS)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="elastrain-bench-sharded-") as folder:
        scratch = Path(folder)
        store = scratch / "store"
        save = {
            every: measure_save(model_config, rounds, every, scratch / f"store-{every}", scratch) for every in (1, 0)
        }
        shutil.copytree(scratch / "store-1", store)  # the checkpoint the load reads: written at 4 ranks
        lost: list[dict[str, Any]] = []
        restart: list[dict[str, Any]] = []
        lost_hsdp: list[dict[str, Any]] = []
        for index in range(repeats):
            cases = [(lost, measure_lost), (restart, measure_restart), (lost_hsdp, measure_lost_hsdp)]
            for samples, measure in reversed(cases) if index % 2 else cases:
                samples.append(measure(model_config, scratch))
        load = {size: measure_load(model_config, rounds, size, store, scratch) for size in LOAD_SIZES}
        progress("DDP state: every rank's share vs rank 0 alone, SeaweedFS S3")
        with SeaweedS3() as s3:
            s3.create_bucket("ddp-persist")
            ddp = ddp_persist.measure(
                DDP_SIZES, **model_config, repeats=repeats, s3=s3, bucket="ddp-persist", folder=scratch
            )
    parameters = save[1]["parameters"]
    total_mb = save[1]["state_bytes_per_rank"] * WORLD / 1e6
    model_text = f"{parameters / 1e6:.1f}M params + AdamW ({total_mb:.0f} MB)"
    lost_s = statistics.median(r["recovery_s"] for r in lost)
    lost_hsdp_s = statistics.median(r["recovery_s"] for r in lost_hsdp)
    restart_s = statistics.median(r["recovery_s"] for r in restart)
    save_case = f"sharded save, {model_text}, {WORLD} ranks"
    dcp_async = "torch.distributed.checkpoint.async_save (returns)"
    rows = [
        Row(save_case, "training blocked: commit due for ShardedStatePersistence", save[1]["commit_s"], dcp_async,
            save[1]["async_save_s"], 1.0),
        Row(save_case, "training blocked: the same, redundancy_every=0", save[0]["commit_s"], dcp_async,
            save[0]["async_save_s"], None),
        Row(save_case, "training blocked: commit, redundancy_every=1", save[1]["commit_s"],
            "the same commit, redundancy_every=0", save[0]["commit_s"], None),
        Row(f"worker lost, FSDP2, {model_text}, {WORLD} → {WORLD - 1} ranks",
            "failed collective caught → first step on the survivors (state from memory)", lost_s,
            "stop all, restart from the DCP checkpoint, as Ray Train does (kill → first step; no Ray)", restart_s,
            0.2),
        Row(f"worker lost, HSDP 2 × 2 (size_multiple=2, no buddy copies), {model_text}, {WORLD} → 2 ranks",
            "failed collective caught → first step of the untouched replica group (nothing moves)", lost_hsdp_s,
            "stop all, restart from the DCP checkpoint (the row above's baseline)", restart_s, 0.2),
        Row(f"worker lost, HSDP 2 × 2 (size_multiple=2, no buddy copies), {model_text}, {WORLD} → 2 ranks",
            "the untouched replica group goes on", lost_hsdp_s,
            f"1-D FSDP2, resharded {WORLD} → {WORLD - 1} from memory (the row above)", lost_s, None),
    ]  # fmt: skip
    for size in LOAD_SIZES:
        rows.append(
            Row(f"load at a new world size, {model_text}, written at {WORLD} ranks",
                f"{size} ranks: ShardedStatePersistence load (list, download, DCP load, reshard)",
                load[size]["ours_s"], "dcp.load + set_state_dict from a local copy, same built model",
                load[size]["dcp_load_s"], 1.2)
        )  # fmt: skip
    for size in DDP_SIZES:
        found = ddp["sizes"][size]
        rows.append(
            Row(f"persist a DDP state ({ddp['state_mib']} MiB: weights + AdamW), SeaweedFS S3, {size} ranks",
                "every rank writes its share (ShardedStatePersistence): commit → committed",
                found["sharded"]["persist"], "rank 0 writes it all (StatePersistence)", found["rank0"]["persist"],
                0.6 if size == 2 else None)
        )  # fmt: skip
    notes = {
        "ddp_persist": ddp,
        "model": {**model_config, "parameters": parameters, "batch": BATCH},
        "state_mib_per_rank": round(save[1]["state_bytes_per_rank"] / 2**20, 1),
        "peak_rss_over_state_per_rank": {
            f"redundancy_every={every}": {
                key: save[every][key]
                for key in (
                    "peak_rss_mib",
                    "rss_after_first_sync_mib",
                    "peak_rss_over_state",
                    "peak_rss_above_start_over_state",
                    "peak_rss_above_first_sync_over_state",
                    "ward_copies_mib",
                )
            }
            for every in (1, 0)
        },
        "worker_lost_breakdown_s": {
            "elastrain": {
                key: round(statistics.median(r[key] for r in lost), 3)
                for key in ("kill_to_caught_s", "leave_s", "form_s", "sync_s", "step_s", "steady_step_s")
            },
            "restart": {key: round(statistics.median(r[key] for r in restart), 3) for key in RESTART_PHASES},
            "hsdp_untouched_group": {
                key: round(statistics.median(r[key] for r in lost_hsdp), 3)
                for key in ("kill_to_caught_s", "leave_s", "form_s", "sync_s", "step_s", "steady_step_s")
            },
        },
        "worker_lost_load": {
            "path": [r["load_path"] for r in lost],
            "lost_commits": [r["lost_commits"] for r in lost],
            "received_mib": [r["received_mib"] for r in lost],
            "restart_loaded_step": [r["loaded_step"] for r in restart],
            "hsdp_path": [r["load_path"] for r in lost_hsdp],
            "hsdp_received_mib": [r["received_mib"] for r in lost_hsdp],
        },
        "rounds": rounds,
        "repeats": repeats,
        "samples_s": {
            "save_redundancy_1": save[1]["samples"],
            "save_redundancy_0": save[0]["samples"],
            "worker_lost": {
                "elastrain": [round(r["recovery_s"], 3) for r in lost],
                "restart": [round(r["recovery_s"], 3) for r in restart],
                "hsdp": [round(r["recovery_s"], 3) for r in lost_hsdp],
            },
            **{f"load_{size}_ranks": load[size]["samples"] for size in LOAD_SIZES},
        },
        "load_one_rank_download_alone_s": {size: load[size]["one_download_alone_s"] for size in LOAD_SIZES},
        "torch_threads_per_process": 1,
        "wall_s": round(time.monotonic() - started),
    }
    write_results("sharded", rows, args.output, notes=notes)


if __name__ == "__main__":
    main()
