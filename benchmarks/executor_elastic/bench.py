"""Elastic recovery: how long training stops when a worker crashes, a node joins, or a node is lost.

Each scenario runs in its own process on a fresh Ray, for elastrain and for Ray Train in the same run:
- worker crash: a worker calls ``os._exit`` at step 30; time from the crash to the next completed training
  step. elastrain's survivors go on in a smaller group at once; Ray Train (``FailureConfig``) restarts the whole
  group from its last checkpoint.
- node added (``ray.cluster_utils.Cluster``): time from ``add_node`` to the first step with the larger group.
- hard node loss (``remove_node(node, allow_graceful=False)``): time to the first step on the remaining workers.

Timestamps come from ``time.time()`` in the workers and the driver; all processes share this machine's clock.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchlib import Row, parse_args, write_results

CRASH_STEP = 30
STEP_S = 0.05


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
            executor.run(elastrain_train, args=[CRASH_STEP + 60, marker], callbacks=[steps.append])
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

    node_args = {"num_cpus": 2, "object_store_memory": 80 * 1024 * 1024}
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

    settings = RayExecutor.create_settings(timeout_s=60, discovery_interval_s=0.2)
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


SCENARIOS = {
    "elastrain_crash": elastrain_crash,
    "elastrain_node_added": elastrain_node_added,
    "elastrain_node_lost": elastrain_node_lost,
    "ray_train_crash": ray_train_crash,
}


def measure_in_child(name: str) -> dict[str, float] | None:
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


# Ray Train V2's elastic numbers need its elastic scaling mode, which this benchmark does not drive yet; until
# it does, they come from ../shared/notes/ray-facts.md (measured on this kind of machine) and are marked so.
RAY_TRAIN_V2_NOTES = {"node_added_s": 22.9, "node_lost_s": 73.6}


def main() -> None:
    if "--scenario" in sys.argv:
        result = SCENARIOS[sys.argv[sys.argv.index("--scenario") + 1]]()
        print(json.dumps(result), flush=True)
        return
    args = parse_args(__doc__ or "")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    results = {name: measure_in_child(name) for name in SCENARIOS}
    rows: list[Row] = []
    crash, train_crash = results["elastrain_crash"], results["ray_train_crash"]
    if crash and train_crash:
        rows.append(
            Row("worker crash, 2 workers", "crash → next step", crash["recovery_s"], "Ray Train FailureConfig restart",
                train_crash["recovery_s"], 0.2)
        )  # fmt: skip
        rows.append(
            Row("worker crash, 2 workers", "crash → replacement joined", crash["back_to_full_s"],
                "Ray Train FailureConfig restart", train_crash["recovery_s"], None)
        )  # fmt: skip
    added, lost = results["elastrain_node_added"], results["elastrain_node_lost"]
    if added:
        rows.append(
            Row("Cluster, node added", "add_node → first step with 2 workers", added["recovery_s"],
                "Ray Train V2 elastic (notes)", RAY_TRAIN_V2_NOTES["node_added_s"], 0.2)
        )  # fmt: skip
    if lost:
        rows.append(
            Row("Cluster, hard node loss", "remove_node → first step on 1 worker", lost["recovery_s"],
                "Ray Train V2 elastic (notes)", RAY_TRAIN_V2_NOTES["node_lost_s"], 0.1)
        )  # fmt: skip
    notes = {
        "failed_scenarios": [name for name, value in results.items() if value is None],
        "ray_train_v2_elastic": "baseline from shared notes, not measured in this run",
        "horovod_elastic": "not measured yet",
    }
    write_results("executor_elastic", rows, args.output, notes=notes)


if __name__ == "__main__":
    main()
