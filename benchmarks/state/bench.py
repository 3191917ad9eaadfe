"""The state actor: write throughput from concurrent drivers, list latency as runs pile up, snapshot cost, memory.

Same run, one local Ray:
- registrations and metric updates per second into the actor from 8 concurrent drivers (Ray tasks, each
  sending its updates and waiting for all of them);
- latency of listing a page of 50 runs (newest first) at 100, 1,000, 10,000 and 100,000 stored runs, and of a
  filtered page at 10,000 — targets: 10,000 and 100,000 within 2× of 100 (#28: 100,000 runs);
- latency of one metric update (an upsert into a stored run's history) at 100 and 100,000 stored runs — target:
  within 2× of 100;
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


def _p50_p99(values: list[float]) -> tuple[float, float]:
    ordered = sorted(values)
    return statistics.median(ordered), ordered[max(0, round(len(ordered) * 0.99) - 1)]


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
    rounds = 100 if args.quick else 1_000
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

        # The latency ladder: one fresh actor of the same class per size, requests interleaved across them so
        # that the machine's noise falls on every size alike. Snapshots on, written only when asked.
        sizes = (100, 1_000, 10_000) if args.quick else (100, 1_000, 10_000, 100_000)
        largest = sizes[-1]
        actors = {
            size: ray.remote(StateActor).options(num_cpus=0).remote(2 * largest, f"{scratch}/{size}", 3600.0)
            for size in sizes
        }
        pids = {size: ray.get(actor.info.remote(), timeout=60)["pid"] for size, actor in actors.items()}
        for size, actor in actors.items():
            for start in range(0, size, 1_000):
                ray.get(
                    [actor.register_run.remote(run_doc(i)) for i in range(start, min(size, start + 1_000))], timeout=600
                )
        samples: dict[str, list[float]] = {str(size): [] for size in sizes} | {"filtered": []}
        upserts: dict[str, list[float]] = {str(size): [] for size in (sizes[0], largest)}
        for step in range(rounds):
            for size, actor in actors.items():
                started = time.perf_counter()
                ray.get(actor.list_runs.remote(limit=50))
                samples[str(size)].append(time.perf_counter() - started)
                if str(size) in upserts:  # a run in the middle of the store reports its next point
                    started = time.perf_counter()
                    ray.get(actor.update_metrics.remote(f"{size // 2:032x}", step, {"loss": 1.0 / (step + 1)}))
                    upserts[str(size)].append(time.perf_counter() - started)
            started = time.perf_counter()
            ray.get(actors[10_000].list_runs.remote(status="FINISHED", job_id=f"{7:08x}", limit=50))
            samples["filtered"].append(time.perf_counter() - started)
        latency = {name: _p50_p99(values) for name, values in samples.items()}
        upsert = {name: _p50_p99(values) for name, values in upserts.items()}
        rss = {size: rss_bytes(pid) for size, pid in pids.items()}
        started = time.perf_counter()
        ray.get(actors[10_000].flush.remote(), timeout=600)
        snapshot_s = time.perf_counter() - started
        for actor in actors.values():
            ray.kill(actor)
    ray.shutdown()

    rows = [
        Row("page of 50 (median)", "10,000 stored runs", latency["10000"][0], "at 100 stored", latency["100"][0], 2.0),
        Row("page of 50 (p99)", "10,000 stored runs", latency["10000"][1], "at 100 stored", latency["100"][1], 2.0),
        Row("page of 50 (median)", "1,000 stored runs", latency["1000"][0], "at 100 stored", latency["100"][0], None),
        Row("page of 50 (median)", f"{largest:,} stored runs", latency[str(largest)][0], "at 100 stored",
            latency["100"][0], 2.0),
        Row("one metric update (median)", f"{largest:,} stored runs", upsert[str(largest)][0], "at 100 stored",
            upsert["100"][0], 2.0),
        Row("one metric update (p99)", f"{largest:,} stored runs", upsert[str(largest)][1], "at 100 stored",
            upsert["100"][1], 2.0),
        Row("filtered page (status + job, median)", "10,000 stored runs", latency["filtered"][0],
            "unfiltered at 10,000", latency["10000"][0], None),
    ]  # fmt: skip
    notes = {
        "drivers": DRIVERS,
        "rounds": rounds,
        "registrations_per_s": round(throughput["register"]),
        "metric_updates_per_s": round(throughput["metrics"]),
        "snapshot_s_at_10000_runs": round(snapshot_s, 3),
        "actor_bytes_per_run": round((rss[largest] - rss[100]) / (largest - 100)),
        "workers_per_run": WORKERS_PER_RUN,
        "page_latency_s": {name: {"p50": round(v[0], 6), "p99": round(v[1], 6)} for name, v in latency.items()},
        "update_latency_s": {name: {"p50": round(v[0], 6), "p99": round(v[1], 6)} for name, v in upsert.items()},
    }
    write_results("state", rows, args.output, notes=notes)


if __name__ == "__main__":
    main()
