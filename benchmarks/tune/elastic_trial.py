"""Node lost under a 2-worker trial: elastrain's elastic executor trial (``elastrain_pair``) going on with its
survivor and growing back once a node joins, against Ray Tune restarting a trainable that runs its own 2-actor
torch gloo group (``tune_pair_restart``) from its last checkpoint.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from cluster import (
    KEEP,
    RESULTS,
    START_TIMEOUT_S,
    STEP_S,
    WORKER_NODE,
    first_after,
    first_of_restarted,
    log_event,
    node_loss,
    pids_before,
    stop_step,
    worker_node,
)

PERSIST_EVERY = 10  # elastrain persists, Tune's trainable checkpoints, every 10 steps
GROW_BOUND_S = 90.0
STEP_TIMEOUT_S = 15.0  # one step of the Tune trainable's actors (normally ~0.06 s)


# -- what runs in the trials ----------------------------------------------------------------------------------


def _tiny_model() -> tuple[Any, Any]:
    import torch

    model = torch.nn.Linear(16, 1)
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def _tiny_step(model: Any, optimizer: Any) -> None:
    """One data-parallel step of the 2-worker jobs: gradients averaged over the group."""
    import torch
    import torch.distributed as dist

    optimizer.zero_grad()
    model(torch.randn(8, 16)).pow(2).mean().backward()
    for parameter in model.parameters():
        dist.all_reduce(parameter.grad)
        parameter.grad /= dist.get_world_size()
    optimizer.step()


def elastic_job(config: dict[str, Any]) -> dict[str, Any]:
    """elastrain: runs on each worker of the executor trial; every rank sends each step (the trial dedups)."""
    import ray
    import torch.distributed as dist

    import elastrain.tune
    from elastrain.executor import elastic, send

    model, optimizer = _tiny_model()
    state = elastic.TorchState(model=model, optimizer=optimizer, step=0)
    state.persist_with(elastrain.tune.trial_persistence())
    node = ray.get_runtime_context().get_node_id()

    @elastic.run
    def loop(state: elastic.TorchState) -> dict[str, Any]:
        while state.step < stop_step(config["stop_file"]):
            _tiny_step(model, optimizer)
            state.step += 1
            rank, size = dist.get_rank(), dist.get_world_size()
            send({"step": int(state.step), "size": size, "rank": rank, "node": node, "t": time.time()})
            time.sleep(STEP_S)
            state.commit()
        return {"last_step": int(state.step)}

    result: dict[str, Any] = loop(state)
    return result


class GlooWorker:
    """Tune baseline: one of the two actors the trainable starts in its placement group."""

    def __init__(self, rank: int) -> None:
        self.rank = rank

    def address(self) -> tuple[str, int]:
        import socket

        import ray

        with socket.socket() as probe:
            probe.bind(("", 0))
            port = probe.getsockname()[1]
        return ray.util.get_node_ip_address(), port

    def setup(self, address: tuple[str, int], state: bytes | None) -> str:
        import datetime
        import io

        import ray
        import torch
        import torch.distributed as dist

        dist.init_process_group(
            "gloo",
            init_method=f"tcp://{address[0]}:{address[1]}",
            rank=self.rank,
            world_size=2,
            timeout=datetime.timedelta(seconds=60),
        )
        self.model, self.optimizer = _tiny_model()
        if state is not None:
            loaded = torch.load(io.BytesIO(state))
            self.model.load_state_dict(loaded["model"])
            self.optimizer.load_state_dict(loaded["optimizer"])
        return str(ray.get_runtime_context().get_node_id())

    def step(self) -> float:
        _tiny_step(self.model, self.optimizer)
        done = time.time()
        time.sleep(STEP_S)
        return done

    def state(self) -> bytes:
        import io

        import torch

        buffer = io.BytesIO()
        torch.save({"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}, buffer)
        return buffer.getvalue()


def _gather(refs: list[Any], timeout_s: float) -> list[Any]:
    """``ray.get`` of ``refs`` that raises as soon as one of them failed (a dead actor's call), not after the
    others, which may wait on that actor in a collective, and raises ``TimeoutError`` after ``timeout_s``."""
    import ray

    deadline = time.monotonic() + timeout_s
    pending = list(refs)
    while pending:
        ready, pending = ray.wait(pending, num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
        if not ready:
            raise TimeoutError(f"{len(pending)} actor call(s) still pending after {timeout_s:g} s")
        ray.get(ready)
    return list(ray.get(refs))


def tune_pair(config: dict[str, Any]) -> None:
    """Tune baseline: a function trainable running its own 2-actor torch gloo group; raises when an actor is
    lost, so that Tune restarts the trial, which resumes from its last checkpoint."""
    import ray
    from ray import tune
    from ray.util import get_current_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    log_event(config, "start")
    step, state = 0, None
    checkpoint = tune.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as folder:
            step = int(Path(folder, "step").read_text())
            state = Path(folder, "state.pt").read_bytes()
        log_event(config, "restored", step=step)
    group = get_current_placement_group()
    actor = ray.remote(num_cpus=1)(GlooWorker)
    workers = [
        actor.options(
            scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=rank + 1)
        ).remote(rank)
        for rank in range(2)
    ]
    try:
        address = _gather([workers[0].address.remote()], START_TIMEOUT_S)[0]
        nodes = _gather([worker.setup.remote(address, state) for worker in workers], START_TIMEOUT_S)
        log_event(config, "group ready")
        while step < stop_step(config["stop_file"]):
            t = _gather([worker.step.remote() for worker in workers], STEP_TIMEOUT_S)[0]
            step += 1
            metrics = {"step": step, "t": t, "size": 2, "node_rank1": nodes[1]}
            if step % PERSIST_EVERY:
                tune.report(metrics)
                continue
            blob = _gather([workers[0].state.remote()], STEP_TIMEOUT_S)[0]
            with tempfile.TemporaryDirectory(prefix="bench-tune-") as folder:
                Path(folder, "step").write_text(str(step))
                Path(folder, "state.pt").write_bytes(blob)
                tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(folder))
    except Exception as error:
        log_event(config, "failed", error=type(error).__name__)
        raise
    finally:
        for worker in workers:  # a restarted trial must not find the old group's actors holding its bundles
            ray.kill(worker, no_restart=True)


# -- scenarios --------------------------------------------------------------------------------------------------


def elastrain_pair() -> dict[str, Any]:
    import elastrain.tune
    from elastrain_testutils.ray_testing import NODE_DEFAULTS

    def make_trainable(s3: dict[str, Any], config: dict[str, Any]) -> Any:
        return elastrain.tune.executor_trainable(
            elastic_job,
            storage=config["storage"],
            storage_options=s3["options"],
            min_workers=1,
            max_workers=2,
            cpus_per_worker=1,
            driver={"trial_driver": 1},
            strategy="SPREAD",
            persist_every=PERSIST_EVERY,
            num_to_keep=KEEP,
        )

    def ready(results: list[dict[str, Any]]) -> bool:
        return any(r["size"] == 2 and r["step"] > PERSIST_EVERY + 5 for r in results)

    def victim(results: list[dict[str, Any]], cluster: Any) -> Any:
        # Rank 1's node (SPREAD: each worker node runs one worker); from rank 0's, the other one.
        nodes = {r["rank"]: r["node"] for r in results if r["size"] == 2}
        if 1 in nodes:
            return worker_node(cluster, nodes[1])
        return next(node for node in cluster.worker_nodes if node.node_id != nodes[0])

    def recovered(results: list[dict[str, Any]], killed_at: float) -> dict[str, Any] | None:
        first = first_after(results, killed_at, lambda r: r["size"] == 1)
        if first is None:
            return None
        before = pids_before(results, killed_at)
        restarted = any(r["pid"] not in before for r in results if r["t"] is not None and r["t"] > killed_at)
        return {"recovery_s": first["t"] - killed_at, "restarted_by_tune": restarted, "first_step_after": first}

    def grow(cluster: Any, killed_at: float) -> dict[str, Any]:
        added_at = time.time()
        try:
            cluster.add_node(**NODE_DEFAULTS, **WORKER_NODE)
            deadline = time.monotonic() + GROW_BOUND_S
            while time.monotonic() < deadline:
                back = first_after(list(RESULTS), added_at, lambda r: r["size"] == 2)
                if back is not None:
                    return {
                        "node_added_to_2_workers_s": back["t"] - added_at,
                        "lost_to_2_workers_s": back["t"] - killed_at,
                    }
                time.sleep(0.1)
        except Exception as error:  # optional: the recovery is measured already
            return {"grow_back": f"{type(error).__name__}: {error}"}
        return {"grow_back": f"not back at 2 workers within {GROW_BOUND_S:g} s of the node joining"}

    return node_loss("elastic", make_trainable, ready=ready, victim=victim, recovered=recovered, after=grow)


def tune_pair_restart() -> dict[str, Any]:
    from ray import tune

    trainable = tune.with_resources(
        tune_pair, tune.PlacementGroupFactory([{"trial_driver": 1}, {"CPU": 1}, {"CPU": 1}], strategy="SPREAD")
    )

    def ready(results: list[dict[str, Any]]) -> bool:
        return any(r["step"] > PERSIST_EVERY + 5 for r in results)

    def victim(results: list[dict[str, Any]], cluster: Any) -> Any:
        return worker_node(cluster, results[-1]["node_rank1"])

    def recovered(results: list[dict[str, Any]], killed_at: float) -> dict[str, Any] | None:
        first = first_of_restarted(results, killed_at)
        if first is None:
            return None
        return {"recovery_s": first["t"] - killed_at, "first_step_after": first}

    return node_loss("pair", lambda s3, config: trainable, ready=ready, victim=victim, recovered=recovered)
