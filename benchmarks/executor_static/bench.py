"""Static executor: start → first result → shutdown, a warm ``run`` round trip, and callback latency.

Compared in one run, with 2 CPU workers and the same trivial function, against raw Ray actors (the limit),
Ray Train's TorchTrainer, and Horovod's RayExecutor when it is installed. Each contender runs in its own
process on its own fresh local Ray (4 CPUs), so what one leaves behind cannot slow another.
"""

from __future__ import annotations

import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from benchlib import Row, median_per_call, median_seconds, parse_args, write_results

NUM_WORKERS = 2


def trivial() -> int:
    return 1


# -- contenders: each returns {"lifecycle_s", "warm_s"?, "message_s"?}; warm calls are measured first, on a
# quiet cluster, before the lifecycle repeats leave dying workers behind. ----------------------------------------


def measure_raw(repeats: int, warm_calls: int) -> dict[str, float]:
    import ray

    @ray.remote(num_cpus=1)
    class RawActor:
        def call(self) -> int:
            return trivial()

    def lifecycle() -> None:
        actors = [RawActor.remote() for _ in range(NUM_WORKERS)]
        ray.get([actor.call.remote() for actor in actors])
        for actor in actors:
            ray.kill(actor)

    actors = [RawActor.remote() for _ in range(NUM_WORKERS)]
    warm = median_per_call(lambda: ray.get([actor.call.remote() for actor in actors]), warm_calls)
    for actor in actors:
        ray.kill(actor)
    return {"lifecycle_s": median_seconds(lifecycle, repeats), "warm_s": warm}


def measure_elastrain(repeats: int, warm_calls: int) -> dict[str, float]:
    from elastrain.executor import RayExecutor, send

    def make() -> RayExecutor:
        return RayExecutor(RayExecutor.create_settings(timeout_s=60), num_workers=NUM_WORKERS)

    def lifecycle() -> None:
        executor = make()
        executor.start()
        executor.run(trivial)
        executor.shutdown()

    def sender(count: int) -> None:
        for _ in range(count):
            send({"sent": time.time()})
            time.sleep(0.02)

    latencies: list[float] = []
    with make() as executor:
        executor.start()
        warm = median_per_call(lambda: executor.run(trivial), warm_calls)
        executor.run(sender, args=[50], callbacks=[lambda m: latencies.append(time.time() - m["sent"])])
    lifecycle_s = median_seconds(lifecycle, repeats)
    return {"lifecycle_s": lifecycle_s, "warm_s": warm, "message_s": statistics.median(latencies)}


def measure_horovod(repeats: int, warm_calls: int) -> dict[str, float]:
    from horovod.ray import RayExecutor as HorovodRayExecutor

    def make() -> Any:
        settings = HorovodRayExecutor.create_settings(timeout_s=60)
        return HorovodRayExecutor(settings, num_workers=NUM_WORKERS, cpus_per_worker=1)

    def lifecycle() -> None:
        executor = make()
        executor.start()
        executor.run(trivial)
        executor.shutdown()

    executor = make()
    executor.start()
    warm = median_per_call(lambda: executor.run(trivial), warm_calls)
    executor.shutdown()
    return {"lifecycle_s": median_seconds(lifecycle, repeats), "warm_s": warm}


def measure_ray_train(repeats: int, warm_calls: int) -> dict[str, float]:
    from ray.train import ScalingConfig
    from ray.train.torch import TorchTrainer

    def train_loop(config: dict[str, Any]) -> None:
        import ray.train

        durations = []
        for step in range(config["reports"]):
            start = time.perf_counter()
            ray.train.report({"step": step})
            durations.append(time.perf_counter() - start)
        if config["reports"] and ray.train.get_context().get_world_rank() == 0:
            # Result.metrics may be empty without a checkpoint; the workers share this machine's disk.
            with open(config["out"], "w") as out:
                out.write(str(statistics.median(durations)))

    def fit(reports: int, out: str = "") -> None:
        trainer = TorchTrainer(
            train_loop,
            train_loop_config={"reports": reports, "out": out},
            scaling_config=ScalingConfig(num_workers=NUM_WORKERS, use_gpu=False),
        )
        trainer.fit()

    lifecycle_s = median_seconds(lambda: fit(0), repeats)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "report_s")
        fit(5, out)
        with open(out) as measured:
            report_s = float(measured.read())
    return {"lifecycle_s": lifecycle_s, "message_s": report_s}


CONTENDERS: dict[str, Callable[[int, int], dict[str, float]]] = {
    "raw": measure_raw,
    "elastrain": measure_elastrain,
    "horovod": measure_horovod,
    "ray_train": measure_ray_train,
}


def run_contender(name: str, repeats: int, warm_calls: int) -> None:
    """Child process: a fresh local Ray, one contender, its numbers as JSON on the last stdout line."""
    import ray

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        result = CONTENDERS[name](repeats, warm_calls)
    finally:
        ray.shutdown()
    print(json.dumps(result), flush=True)


def measure_in_child(name: str, quick: bool) -> dict[str, float]:
    command = [sys.executable, __file__, "--contender", name] + (["--quick"] if quick else [])
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"contender {name} failed:\n{done.stderr[-3000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def main() -> None:
    if "--contender" in sys.argv:
        name = sys.argv[sys.argv.index("--contender") + 1]
        quick = "--quick" in sys.argv
        run_contender(name, repeats=1 if quick else 3, warm_calls=20 if quick else 200)
        return
    args = parse_args(__doc__ or "")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    have_horovod = importlib.util.find_spec("horovod") is not None
    names = ["raw", "elastrain", "ray_train"] + (["horovod"] if have_horovod else [])
    results = {name: measure_in_child(name, args.quick) for name in names}
    ours, raw, train = results["elastrain"], results["raw"], results["ray_train"]
    case = f"{NUM_WORKERS} CPU workers"
    lifecycle = "start → first result → shutdown"
    rows = [
        Row(case, lifecycle, ours["lifecycle_s"], "Ray Train TorchTrainer.fit", train["lifecycle_s"], 0.25),
        Row(case, lifecycle, ours["lifecycle_s"], "raw Ray actors (limit)", raw["lifecycle_s"], None),
        Row(case, "warm run round trip", ours["warm_s"], "raw Ray actor round trip", raw["warm_s"], 1.5),
        Row(case, "callback delivery", ours["message_s"], "Ray Train report()", train["message_s"], None, 0.010),
    ]
    if have_horovod:
        horovod = results["horovod"]
        rows.insert(2, Row(case, lifecycle, ours["lifecycle_s"], "Horovod RayExecutor", horovod["lifecycle_s"], None))
        rows.insert(4, Row(case, "warm run round trip", ours["warm_s"], "Horovod run", horovod["warm_s"], None))
    notes = {"horovod": "measured" if have_horovod else "not installed (run `nox -s tests_horovod` first)"}
    write_results("executor_static", rows, args.output, notes=notes)


if __name__ == "__main__":
    main()
