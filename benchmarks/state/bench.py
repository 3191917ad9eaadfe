"""The state actor: write throughput from concurrent drivers, list latency as runs pile up, snapshot cost, memory.

Same run, one local Ray:
- registrations and metric updates per second into the actor from 8 concurrent drivers (Ray tasks, each
  sending its updates and waiting for all of them);
- latency of listing a page of 50 runs (newest first) at 100, 1,000 and 10,000 stored runs, and of a filtered
  page at 10,000 — target: 10,000 within 2× of 100;
- the cost of one snapshot of 10,000 runs, and the actor's memory per stored run.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from typing import Any

from benchlib import Row, parse_args, write_results

DRIVERS = 8
WORKERS_PER_RUN = 4


def run_doc(index: int, status: str = "FINISHED") -> dict[str, Any]:
    from elastrain.state import RunStatus, TrainRunInfo, TrainWorkerInfo

    workers = [
        TrainWorkerInfo(
            actor_id=f"{index:08x}{rank:024x}", world_rank=rank, local_rank=rank, node_rank=0, node_id="n" * 56,
            node_ip="10.0.0.1", hostname="host", pid=10_000 + rank, gpu_ids=(str(rank),),
        )
        for rank in range(WORKERS_PER_RUN)
    ]  # fmt: skip
    return TrainRunInfo(
        name=f"model-{index % 10}", id=f"{index:032x}", job_id=f"{index % 50:08x}", workers=tuple(workers),
        run_status=RunStatus(status), start_time_ms=1_700_000_000_000 + index, world_size=WORKERS_PER_RUN,
        end_time_ms=1_700_000_100_000 + index if status != "RUNNING" else None,
    ).model_dump(mode="json")  # fmt: skip


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def main() -> None:
    import ray

    from elastrain.state import StateActor, get_or_create_state_actor

    args = parse_args(__doc__ or "")
    per_driver = 100 if args.quick else 500
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    with tempfile.TemporaryDirectory(prefix="elastrain-state-bench-") as scratch:
        named = get_or_create_state_actor(max_runs=20_000)
        ray.get(named.info.remote(), timeout=60)

        @ray.remote(num_cpus=0.25)
        def driver(offset: int, count: int, kind: str) -> None:
            from elastrain.state import get_state_actor

            state = get_state_actor()
            if kind == "register":
                ray.get([state.register_run.remote(run_doc(offset + i, "RUNNING")) for i in range(count)])
            else:
                ray.get([state.update_metrics.remote(f"{offset + i:032x}", i, {"loss": 0.5}) for i in range(count)])

        throughput: dict[str, float] = {}
        for kind in ("register", "metrics"):
            started = time.perf_counter()
            ray.get([driver.remote(d * per_driver, per_driver, kind) for d in range(DRIVERS)], timeout=600)
            throughput[kind] = DRIVERS * per_driver / (time.perf_counter() - started)
        ray.kill(named, no_restart=True)

        # The latency ladder on a fresh actor of the same class (snapshots on, written only when asked).
        actor = ray.remote(StateActor).options(num_cpus=0).remote(20_000, scratch, 3600.0)
        pid = ray.get(actor.info.remote(), timeout=60)["pid"]

        def page_latency(filters: dict[str, Any]) -> tuple[float, float]:
            samples = []
            for _ in range(200):
                started = time.perf_counter()
                ray.get(actor.list_runs.remote(limit=50, **filters))
                samples.append(time.perf_counter() - started)
            samples.sort()
            return statistics.median(samples), samples[int(len(samples) * 0.99) - 1]

        latency: dict[int, tuple[float, float]] = {}
        rss: dict[int, int] = {}
        stored = 0
        for target in (100, 1_000, 10_000):
            ray.get([actor.register_run.remote(run_doc(i)) for i in range(stored, target)], timeout=600)
            stored = target
            latency[target] = page_latency({})
            rss[target] = rss_bytes(pid)
        filtered = page_latency({"status": "FINISHED", "job_id": f"{7:08x}"})
        started = time.perf_counter()
        ray.get(actor.flush.remote(), timeout=600)
        snapshot_s = time.perf_counter() - started
        ray.kill(actor)
    ray.shutdown()

    rows = [
        Row("page of 50 (median)", "10,000 stored runs", latency[10_000][0], "at 100 stored", latency[100][0], 2.0),
        Row("page of 50 (p99)", "10,000 stored runs", latency[10_000][1], "at 100 stored", latency[100][1], 2.0),
        Row("page of 50 (median)", "1,000 stored runs", latency[1_000][0], "at 100 stored", latency[100][0], None),
        Row("filtered page (status + job, median)", "10,000 stored runs", filtered[0], "unfiltered at 10,000",
            latency[10_000][0], None),
    ]  # fmt: skip
    notes = {
        "drivers": DRIVERS,
        "registrations_per_s": round(throughput["register"]),
        "metric_updates_per_s": round(throughput["metrics"]),
        "snapshot_s_at_10000_runs": round(snapshot_s, 3),
        "actor_bytes_per_run": round((rss[10_000] - rss[100]) / 9_900),
        "workers_per_run": WORKERS_PER_RUN,
        "page_latency_s": {str(k): {"p50": round(v[0], 6), "p99": round(v[1], 6)} for k, v in latency.items()},
    }
    write_results("state", rows, args.output, notes=notes)


if __name__ == "__main__":
    main()
