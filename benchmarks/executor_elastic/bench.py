"""Elastic recovery: how long training stops when a worker crashes, a node joins, or a node is lost.

Each scenario runs in its own process on a fresh Ray, for elastrain, Ray Train and (when installed) Horovod
elastic, in the same run. elastrain's discovery and Ray Train V2's resize monitor both look every second:
- worker crash: a worker calls ``os._exit`` at step 30; time from the crash to the next completed training
  step. elastrain's survivors go on in a smaller group at once; Ray Train (``FailureConfig``) restarts the whole
  group from its last checkpoint.
- node added (``ray.cluster_utils.Cluster``): time from ``add_node`` to the first step with the larger group.
- hard node loss (``remove_node(node, allow_graceful=False)``): time to the first step on the remaining workers.
- against torchft 0.2.0 (``torchft_baseline.py``; 3 replica groups, 1 s join timeout, 5 s process-group
  timeout) with elastrain's ``replacement.py`` (the same model, step time and commit every step): crash → the
  survivors' next step, and replacement started → its first step in sync; and whether DDP ever crashed a
  survivor (torchft's DDP wrapper, elastrain's ``elastic.DistributedDataParallel``).
- frozen worker (``freeze.py``): a worker SIGSTOPs itself at step 30 (it neither exits nor closes its
  sockets, like a lost node); time from the freeze to the first step begun after it on the others. elastrain
  evicts it after ``liveness_timeout_s`` (default 8 s; also run at 5 s); torchft 0.2.0 (``torchft_baseline``,
  the same 3-replica job) waits out its process-group timeout, 5 s and its default 60 s; Ray Train V2 (default
  settings) blocks until its 600 s worker health check, so it is bounded at 90 s. Runs that get no step within
  their bound SIGKILL the frozen process and report the bound.
- sync at a reset (``sync_at_reset.py``): ``TorchState`` bringing a 100M-parameter model with Adam state to a
  newcomer and to a survivor, against ``torch.distributed.broadcast`` of the same tensors, with peak memory.

Every scenario runs ``REPEATS`` times, each in a fresh process and Ray, and the rows show medians (a single
cluster run here varies by about a second). Timestamps come from ``time.time()`` in the workers and the driver;
all processes share this machine's clock.
"""

from __future__ import annotations

import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchlib import Row, median_of_runs, parse_args, write_results

CRASH_STEP = 30
STEP_S = 0.05
# How often elastrain polls discovery and Ray Train V2 considers resizing: the same for both.
MONITOR_INTERVAL_S = 1.0
# Every scenario runs this many times (each in a fresh process and Ray); rows show the medians.
REPEATS = 3
NODE_ARGS = {"num_cpus": 2, "object_store_memory": 80 * 1024 * 1024}


# -- elastrain ------------------------------------------------------------------------------------------------


def elastrain_train(steps: int, crash_marker: str) -> int:
    import torch
    import torch.distributed as dist

    from elastrain.executor import elastic, send

    state = elastic.ObjectState(step=0)

    @elastic.run
    def train(state: elastic.ObjectState) -> int:
        while state.step < steps:
            if crash_marker and state.step == CRASH_STEP and dist.get_rank() == 1 and not os.path.exists(crash_marker):
                Path(crash_marker).write_text(str(time.time()))
                os._exit(1)
            value = torch.ones(1)
            dist.all_reduce(value)
            state.step += 1
            send({"t": time.time(), "size": dist.get_world_size(), "step": state.step})
            time.sleep(STEP_S)
            state.commit()
        return int(state.step)

    return int(train(state))


def elastrain_crash() -> dict[str, float]:
    import ray

    from elastrain.executor import RayExecutor

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    steps: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        marker = os.path.join(tmp, "crashed")
        settings = RayExecutor.create_settings(timeout_s=60)
        # min_workers=1: the survivor may go on alone while the replacement starts.
        with RayExecutor(settings, min_workers=1, max_workers=2, cpus_per_worker=1) as executor:
            executor.start()
            executor.run(elastrain_train, args=[CRASH_STEP + 100, marker], callbacks=[steps.append])
        crashed_at = float(Path(marker).read_text())
    ray.shutdown()
    after = [m for m in steps if m["t"] > crashed_at]
    full = [m for m in after if m["size"] == 2]
    return {"recovery_s": after[0]["t"] - crashed_at, "back_to_full_s": full[0]["t"] - crashed_at}


def _cluster_run(change: str) -> dict[str, float]:
    """A 2-CPU-per-node Cluster, one worker per node; ``change`` is ``add`` or ``lose`` a node mid-run."""
    import ray
    from ray.cluster_utils import Cluster

    from elastrain.executor import RayExecutor

    node_args = NODE_ARGS
    cluster = Cluster(initialize_head=True, head_node_args={**node_args, "include_dashboard": False})
    extra = cluster.add_node(**node_args) if change == "lose" else None
    ray.init(address=cluster.address, log_to_driver=False)
    cluster.wait_for_nodes()
    steps: list[dict[str, Any]] = []
    running = threading.Event()
    expected_before = 2 if change == "lose" else 1

    def on_message(message: dict[str, Any]) -> None:
        steps.append(message)
        if message["size"] == expected_before and message["step"] > 20:
            running.set()

    settings = RayExecutor.create_settings(timeout_s=60, discovery_interval_s=MONITOR_INTERVAL_S)
    executor = RayExecutor(settings, min_workers=1, max_workers=2, cpus_per_worker=2, elastic_timeout=120)
    executor.start()
    job_done = threading.Event()
    job = threading.Thread(
        target=lambda: (executor.run(elastrain_train, args=[400, ""], callbacks=[on_message]), job_done.set())
    )
    job.start()
    assert running.wait(120)
    changed_at = time.time()
    if change == "add":
        cluster.add_node(**node_args)
    else:
        cluster.remove_node(extra, allow_graceful=False)
    job.join(300)
    executor.shutdown()
    ray.shutdown()
    cluster.shutdown()
    wanted = 2 if change == "add" else 1
    after = [m for m in steps if m["t"] > changed_at and m["size"] == wanted]
    return {"recovery_s": after[0]["t"] - changed_at}


def elastrain_node_added() -> dict[str, float]:
    return _cluster_run("add")


def elastrain_node_lost() -> dict[str, float]:
    return _cluster_run("lose")


# -- Ray Train --------------------------------------------------------------------------------------------------


def ray_train_crash() -> dict[str, float]:
    import ray
    from ray.train import Checkpoint, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    with tempfile.TemporaryDirectory() as tmp:
        marker, log = os.path.join(tmp, "crashed"), os.path.join(tmp, "steps")

        def loop(config: dict[str, Any]) -> None:
            import ray.train

            start = 0
            checkpoint = ray.train.get_checkpoint()
            if checkpoint:
                with checkpoint.as_directory() as directory:
                    start = int(Path(directory, "step").read_text())
            rank = ray.train.get_context().get_world_rank()
            for step in range(start, CRASH_STEP + 10):
                if step == CRASH_STEP and rank == 1 and not os.path.exists(config["marker"]):
                    Path(config["marker"]).write_text(str(time.time()))
                    os._exit(1)
                time.sleep(STEP_S)
                with open(config["log"], "a") as out:
                    out.write(f"{time.time()} {os.getpid()}\n")
                with tempfile.TemporaryDirectory() as directory:
                    Path(directory, "step").write_text(str(step + 1))
                    ray.train.report({"step": step}, checkpoint=Checkpoint.from_directory(directory))

        trainer = TorchTrainer(
            loop,
            train_loop_config={"marker": marker, "log": log},
            scaling_config=ScalingConfig(num_workers=2),
            run_config=RunConfig(storage_path=tmp, failure_config=FailureConfig(max_failures=2)),
        )
        trainer.fit()
        crashed_at = float(Path(marker).read_text())
        entries = [(float(t), pid) for t, pid in (line.split() for line in Path(log).read_text().splitlines())]
    ray.shutdown()
    # The first step of the restarted group: from a worker process that did not exist before the crash.
    before = {pid for t, pid in entries if t < crashed_at}
    return {"recovery_s": min(t for t, pid in entries if t > crashed_at and pid not in before) - crashed_at}


def _ray_train_cluster(change: str) -> dict[str, float]:
    """Ray Train V2 elastic (``num_workers=(1, 2)``), one 2-CPU worker per node, a node added or lost."""
    import ray
    from ray.cluster_utils import Cluster
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    cluster = Cluster(initialize_head=True, head_node_args={**NODE_ARGS, "include_dashboard": False})
    extra = cluster.add_node(**NODE_ARGS) if change == "lose" else None
    ray.init(address=cluster.address, log_to_driver=False)
    cluster.wait_for_nodes()
    with tempfile.TemporaryDirectory() as tmp:
        log, stop = os.path.join(tmp, "steps"), os.path.join(tmp, "stop")

        def loop(config: dict[str, Any]) -> None:
            import ray.train

            size = ray.train.get_context().get_world_size()
            while not os.path.exists(config["stop"]):
                time.sleep(STEP_S)
                with open(config["log"], "a") as out:
                    out.write(f"{time.time()} {size}\n")

        trainer = TorchTrainer(
            loop,
            train_loop_config={"log": log, "stop": stop},
            scaling_config=ScalingConfig(
                num_workers=(1, 2),
                resources_per_worker={"CPU": 2},
                elastic_resize_monitor_interval_s=MONITOR_INTERVAL_S,
            ),
            run_config=RunConfig(storage_path=tmp, failure_config=FailureConfig(max_failures=3)),
        )
        fit = threading.Thread(target=trainer.fit, daemon=True)
        fit.start()

        def entries() -> list[tuple[float, int]]:
            if not os.path.exists(log):
                return []
            return [(float(t), int(n)) for t, n in (line.split() for line in Path(log).read_text().splitlines())]

        before, wanted = (2, 1) if change == "lose" else (1, 2)
        deadline = time.time() + 180
        while sum(1 for _, n in entries() if n == before) < 20 and time.time() < deadline:
            time.sleep(0.1)
        changed_at = time.time()
        if change == "add":
            cluster.add_node(**NODE_ARGS)
        else:
            cluster.remove_node(extra, allow_graceful=False)
        deadline = time.time() + 240
        while not [t for t, n in entries() if t > changed_at and n == wanted] and time.time() < deadline:
            time.sleep(0.1)
        after = [t for t, n in entries() if t > changed_at and n == wanted]
        Path(stop).write_text("")
        fit.join(60)
    ray.shutdown()
    cluster.shutdown()
    if not after:
        raise RuntimeError(f"Ray Train never reached {wanted} workers after the node was {change}ed")
    return {"recovery_s": after[0] - changed_at}


def ray_train_node_added() -> dict[str, float]:
    return _ray_train_cluster("add")


def ray_train_node_lost() -> dict[str, float]:
    return _ray_train_cluster("lose")


def horovod_train(steps: int, crash_marker: str, log: str) -> int:
    import horovod.torch as hvd
    import torch

    hvd.init()
    state = hvd.elastic.TorchState(step=0)  # horovod.torch.elastic has no ObjectState

    @hvd.elastic.run
    def train(state: Any) -> int:
        while state.step < steps:
            if state.step == CRASH_STEP and hvd.rank() == 1 and not os.path.exists(crash_marker):
                Path(crash_marker).write_text(str(time.time()))
                os._exit(1)
            hvd.allreduce(torch.ones(1))
            state.step += 1
            with open(log, "a") as out:
                out.write(f"{time.time()}\n")
            time.sleep(STEP_S)
            state.commit()
        return int(state.step)

    return int(train(state))


def horovod_crash() -> dict[str, Any]:
    import ray
    from horovod.ray import RayExecutor as HorovodRayExecutor

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    with tempfile.TemporaryDirectory() as tmp:
        marker, log = os.path.join(tmp, "crashed"), os.path.join(tmp, "steps")
        settings = HorovodRayExecutor.create_settings(timeout_s=60, nics={"lo"})
        executor = HorovodRayExecutor(settings, min_workers=1, max_workers=2, cpus_per_worker=1)
        executor.start()
        try:
            executor.run(lambda: horovod_train(CRASH_STEP + 60, marker, log))
        except RuntimeError as error:  # Horovod ends the job when a worker process exits
            return {"failed": str(error).strip().splitlines()[0][:300]}
        finally:
            executor.shutdown()
            ray.shutdown()
        crashed_at = float(Path(marker).read_text())
        times = [float(line) for line in Path(log).read_text().split()]
    return {"recovery_s": min(t for t in times if t > crashed_at) - crashed_at}


def elastrain_replacement() -> dict[str, Any]:
    import replacement

    return replacement.measure(use_ddp=False)


def elastrain_replacement_ddp() -> dict[str, Any]:
    import replacement

    return replacement.measure(use_ddp=True)


def torchft_recovery() -> dict[str, Any]:
    import torchft_baseline

    result = torchft_baseline.measure_torchft(repeats=REPEATS)
    if "skipped" in result:
        return {"skipped": result["skipped"]}
    return {
        "recovery_s": result["crash_to_next_commit_s"]["median"],
        "replacement_to_first_step_s": result["restart_to_first_commit_s"]["median"],
        "ddp_survivor_crashed": result.get("ddp_survivor_crashed"),
        "ddp_error": result.get("ddp_error"),
    }


# Frozen worker: bounds on the wait for the survivors, after which the frozen process is SIGKILLed.
FREEZE_BOUND_S = 30.0
SLOW_FREEZE_BOUND_S = 90.0  # torchft's 60 s default timeout; Ray Train V2's 600 s health check


def elastrain_freeze() -> dict[str, Any]:
    import freeze

    return freeze.measure_elastrain(liveness_timeout_s=None, bound_s=FREEZE_BOUND_S)


def elastrain_freeze_5s() -> dict[str, Any]:
    import freeze

    return freeze.measure_elastrain(liveness_timeout_s=5.0, bound_s=FREEZE_BOUND_S)


def _torchft_freeze(repeats: int, pg_timeout_s: float | None, bound_s: float) -> dict[str, Any]:
    import torchft_baseline

    result = torchft_baseline.measure_torchft_freeze(repeats, pg_timeout_s=pg_timeout_s, bound_s=bound_s)
    if "skipped" in result:
        return {"skipped": result["skipped"]}
    rounds = result["freeze_to_next_commit_s"]
    return {
        # Rounds with no commit within the bound count as the bound (a lower bound) in the median.
        "recovery_s": statistics.median(rounds.get("values", []) + [bound_s] * rounds["unrecovered"]),
        "unrecovered_rounds": rounds["unrecovered"],
        "per_survivor_s": rounds["per_survivor"],
        "bound_s": bound_s,
    }


def torchft_freeze() -> dict[str, Any]:
    return _torchft_freeze(REPEATS, 5.0, FREEZE_BOUND_S)


def torchft_freeze_default() -> dict[str, Any]:
    return _torchft_freeze(1, None, SLOW_FREEZE_BOUND_S)


def ray_train_freeze() -> dict[str, Any]:
    import freeze

    return freeze.measure_ray_train(health_check_timeout_s=None, bound_s=SLOW_FREEZE_BOUND_S)


def elastrain_sync() -> dict[str, Any]:
    import sync_at_reset

    return sync_at_reset.measure()


SCENARIOS = {
    "elastrain_crash": elastrain_crash,
    "elastrain_node_added": elastrain_node_added,
    "elastrain_node_lost": elastrain_node_lost,
    "ray_train_crash": ray_train_crash,
    "ray_train_node_added": ray_train_node_added,
    "ray_train_node_lost": ray_train_node_lost,
    "horovod_crash": horovod_crash,
    "elastrain_replacement": elastrain_replacement,
    "elastrain_replacement_ddp": elastrain_replacement_ddp,
    # torchft repeats inside one job (one lighthouse), elastrain's sync inside one Ray job: one child each.
    "torchft_recovery": torchft_recovery,
    "elastrain_freeze": elastrain_freeze,
    "elastrain_freeze_5s": elastrain_freeze_5s,
    # torchft repeats its 5 s freeze inside one job; its 60 s default and Ray Train's bound run once.
    "torchft_freeze": torchft_freeze,
    "torchft_freeze_default": torchft_freeze_default,
    "ray_train_freeze": ray_train_freeze,
    "elastrain_sync": elastrain_sync,
}
# torchft_recovery runs like ours (3 times, ~25 s each): its one sample moved by 0.23 s between two runs.
RUN_ONCE = {"horovod_crash", "elastrain_sync", "torchft_freeze", "torchft_freeze_default", "ray_train_freeze"}


def torchft_rows(results: dict[str, Any]) -> list[Row]:
    ours, theirs = results.get("elastrain_replacement"), results.get("torchft_recovery")
    ours_ddp = results.get("elastrain_replacement_ddp")
    if not ours or not theirs or "recovery_s" not in theirs:
        return []
    case = "worker crash, CPU/gloo"
    rows = [
        Row(case, "crash → survivors' next step", ours["recovery_s"], "torchft 0.2.0 (1 s join timeout)",
            theirs["recovery_s"], 0.25),
        Row(case, "replacement started → first step in sync", ours["replacement_to_first_step_s"],
            "torchft 0.2.0 restart → first commit", theirs["replacement_to_first_step_s"], 1.0),
    ]  # fmt: skip
    if ours_ddp:
        rows.append(
            Row(case + ", elastic DDP", "crash → survivors' next step", ours_ddp["recovery_s"],
                "torchft 0.2.0 (1 s join timeout)", theirs["recovery_s"], None)
        )  # fmt: skip
    return rows


def _bounded(label: str, result: dict[str, Any], recovered: bool) -> str:
    return label if recovered else f"{label}: no step within {result['bound_s']:g} s (lower bound)"


def freeze_rows(results: dict[str, Any]) -> list[Row]:
    ours, ours_5s = results.get("elastrain_freeze"), results.get("elastrain_freeze_5s")
    tf_5s, tf_default = results.get("torchft_freeze"), results.get("torchft_freeze_default")
    ray_train = results.get("ray_train_freeze")
    case = "frozen worker (SIGSTOP), CPU/gloo"
    rows = []
    if ours and tf_default and "recovery_s" in tf_default:
        label = _bounded("torchft 0.2.0, default 60 s timeouts", tf_default, not tf_default["unrecovered_rounds"])
        rows.append(
            Row(case, "freeze → survivors' next step, default settings (liveness 8 s)", ours["recovery_s"],
                label, tf_default["recovery_s"], None, target_s=10.0)
        )  # fmt: skip
    if ours_5s and tf_5s and "recovery_s" in tf_5s:
        label = _bounded("torchft 0.2.0, 5 s process-group timeout", tf_5s, not tf_5s["unrecovered_rounds"])
        rows.append(
            Row(case, "freeze → survivors' next step, liveness_timeout_s=5", ours_5s["recovery_s"], label,
                tf_5s["recovery_s"], 1.0)
        )  # fmt: skip
    if ours and ray_train:
        label = _bounded("Ray Train V2 default (600 s health check)", ray_train, ray_train["recovered"] is True)
        rows.append(
            Row(case, "freeze → next step, default settings", ours["recovery_s"], label, ray_train["recovery_s"],
                None)
        )  # fmt: skip
    return rows


def sync_rows(results: dict[str, Any]) -> list[Row]:
    sync = results.get("elastrain_sync")
    if not sync:
        return []
    case = f"sync at a reset, {sync['parameters'] / 1e6:.0f}M parameters + Adam"
    return [
        Row(case, "survivor (state in place)", sync["sync_survivor_s"], "dist.broadcast into held tensors",
            sync["broadcast_s"], 1.3),
        Row(case, "newcomer (allocates optimizer state)", sync["sync_newcomer_s"],
            "dist.broadcast into freshly allocated tensors", sync["broadcast_allocating_s"], 1.3),
    ]  # fmt: skip


def measure_in_child(name: str, repeats: int) -> dict[str, Any] | None:
    """Median of each measured value over ``repeats`` runs of the scenario, each in its own process."""
    return median_of_runs([run for run in (_one_child_run(name) for _ in range(repeats)) if run is not None])


def _one_child_run(name: str) -> dict[str, Any] | None:
    command = [sys.executable, __file__, "--scenario", name]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    except subprocess.TimeoutExpired:
        print(f"scenario {name} timed out", file=sys.stderr)
        return None
    if done.returncode != 0:
        print(f"scenario {name} failed:\n{done.stderr[-3000:]}", file=sys.stderr)
        return None
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def main() -> None:
    if "--scenario" in sys.argv:
        result = SCENARIOS[sys.argv[sys.argv.index("--scenario") + 1]]()
        print(json.dumps(result), flush=True)
        return
    args = parse_args(__doc__ or "")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    have_horovod = importlib.util.find_spec("horovod") is not None
    repeats = 1 if args.quick else REPEATS
    results = {
        name: measure_in_child(name, 1 if name in RUN_ONCE else repeats)
        for name in SCENARIOS
        if have_horovod or not name.startswith("horovod")
    }
    rows: list[Row] = []
    crash, train_crash = results.get("elastrain_crash"), results.get("ray_train_crash")
    if crash and train_crash:
        rows.append(
            Row("worker crash, 2 workers", "crash → next step", crash["recovery_s"], "Ray Train FailureConfig restart",
                train_crash["recovery_s"], 0.2)
        )  # fmt: skip
        rows.append(
            Row("worker crash, 2 workers", "crash → replacement joined", crash["back_to_full_s"],
                "Ray Train FailureConfig restart", train_crash["recovery_s"], None)
        )  # fmt: skip
    horovod = results.get("horovod_crash")
    if crash and horovod and "recovery_s" in horovod:
        rows.append(
            Row("worker crash, 2 workers", "crash → next step", crash["recovery_s"], "Horovod elastic",
                horovod["recovery_s"], None)
        )  # fmt: skip
    for scenario, metric, target in (
        ("node_added", "add_node → first step with 2 workers", 0.2),
        ("node_lost", "remove_node(allow_graceful=False) → first step on 1 worker", 0.1),
    ):
        ours, theirs = results.get(f"elastrain_{scenario}"), results.get(f"ray_train_{scenario}")
        if ours and theirs:
            case = "Cluster, node added" if scenario == "node_added" else "Cluster, hard node loss"
            rows.append(Row(case, metric, ours["recovery_s"], "Ray Train V2 elastic", theirs["recovery_s"], target))
    rows += torchft_rows(results)
    rows += freeze_rows(results)
    rows += sync_rows(results)
    notes = {
        "failed_scenarios": [name for name, value in results.items() if value is None],
        "ddp_survivor_crashed": {
            "elastrain": (results.get("elastrain_replacement_ddp") or {}).get("ddp_survivor_crashed"),
            "torchft": (results.get("torchft_recovery") or {}).get("ddp_survivor_crashed"),
            "torchft_error": (results.get("torchft_recovery") or {}).get("ddp_error"),
        },
        "sync_peak_rss_over_model_and_optimizer": {
            key: round(value, 2)
            for key, value in (results.get("elastrain_sync") or {}).items()
            if key.startswith("peak_rss_ratio")
        },
        "frozen_worker": {
            "elastrain_recovered": {
                name: (results.get(name) or {}).get("recovered") for name in ("elastrain_freeze", "elastrain_freeze_5s")
            },
            "elastrain_back_to_full_s": {
                name: (results.get(name) or {}).get("back_to_full_s")
                for name in ("elastrain_freeze", "elastrain_freeze_5s")
            },
            "torchft_per_survivor_s": {
                name: (results.get(name) or {}).get("per_survivor_s")
                for name in ("torchft_freeze", "torchft_freeze_default")
            },
            "ray_train": {
                key: value
                for key, value in (results.get("ray_train_freeze") or {}).items()
                if key in ("recovered", "next_step_by", "survivor_steps_before_bound", "fit", "v2_enabled")
            },
        },
        "monitor_interval_s": MONITOR_INTERVAL_S,
        "repeats": repeats,
        "samples_s": {name: value["samples"] for name, value in results.items() if value},
        "horovod": "measured" if have_horovod else "not installed (run `nox -s tests_horovod` first)",
        "horovod_crash": (horovod or {}).get("failed", "recovered" if horovod else "not run"),
    }
    write_results("executor_elastic", rows, args.output, notes=notes)


if __name__ == "__main__":
    main()
