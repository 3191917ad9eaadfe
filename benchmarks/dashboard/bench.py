"""Listing runs: elastrain's API vs Ray's own Train runs endpoint, at 100 and 10,000 stored runs.

Same run, one local Ray with its dashboard and Ray Train's state tracking on (``RAY_TRAIN_ENABLE_STATE_TRACKING=1``;
token auth off for this cluster only). Both state actors are seeded with the same runs (4 workers each):
- elastrain: ``GET /api/train/runs?limit=50`` (a page of 50, workers decorated with one actor-table query);
- Ray: ``GET /api/train/v2/runs`` (every run at once, decorated with one actor query per run).
p50 and p99 over repeated requests; target: elastrain at 10,000 runs ≤ 0.1× Ray's at 10,000. Then elastrain's own
store grows to 100,000 runs (Ray's endpoint is not asked there: it lists every run at once, 9 s at 10,000) —
target (#28): its page at 100,000 within 2× of its page at 100.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

os.environ.setdefault("RAY_TRAIN_ENABLE_STATE_TRACKING", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # this benchmark's own cluster only

from benchlib import Row, parse_args, write_results

WORKERS = 4


def seed_ray(actor: Any, start: int, stop: int, job_id: str, node_id: str) -> None:
    import ray
    from ray.train._internal.state.schema import ActorStatusEnum, RunStatusEnum, TrainRunInfo, TrainWorkerInfo

    runs = []
    for index in range(start, stop):
        workers = [
            TrainWorkerInfo(
                actor_id=f"{index:024x}{rank:08x}", world_rank=rank, local_rank=rank, node_rank=0, node_id=node_id,
                node_ip="127.0.0.1", pid=1000 + rank, gpu_ids=[], status=ActorStatusEnum.DEAD, resources={"CPU": 1.0},
            )
            for rank in range(WORKERS)
        ]  # fmt: skip
        runs.append(
            TrainRunInfo(
                name=f"model-{index % 10}", id=f"{index:032x}", job_id=job_id, controller_actor_id=f"{index:032x}",
                workers=workers, datasets=[], run_status=RunStatusEnum.FINISHED, status_detail="",
                start_time_ms=1_700_000_000_000 + index, end_time_ms=1_700_000_100_000 + index,
                resources=[{"CPU": 1.0}] * WORKERS,
            )
        )  # fmt: skip
    ray.get([actor.register_train_run.remote(run) for run in runs], timeout=600)


def seed_ours(actor: Any, start: int, stop: int, job_id: str, node_id: str) -> None:
    import ray

    from elastrain.state import RunStatus, TrainRunInfo, TrainWorkerInfo

    documents = []
    for index in range(start, stop):
        workers = tuple(
            TrainWorkerInfo(
                actor_id=f"{index:024x}{rank:08x}", world_rank=rank, local_rank=rank, node_rank=0, node_id=node_id,
                node_ip="127.0.0.1", hostname="host", pid=1000 + rank,
            )
            for rank in range(WORKERS)
        )  # fmt: skip
        documents.append(
            TrainRunInfo(
                name=f"model-{index % 10}", id=f"{index:032x}", job_id=job_id, controller_actor_id=f"{index:032x}",
                workers=workers, run_status=RunStatus.FINISHED, start_time_ms=1_700_000_000_000 + index,
                end_time_ms=1_700_000_100_000 + index, world_size=WORKERS,
            ).model_dump(mode="json")
        )  # fmt: skip
    ray.get([actor.register_run.remote(document) for document in documents], timeout=600)


def latency(client: Any, url: str, requests: int) -> tuple[float, float]:
    samples = []
    client.get(url).raise_for_status()  # warm
    for _ in range(requests):
        started = time.perf_counter()
        response = client.get(url)
        samples.append(time.perf_counter() - started)
        response.raise_for_status()
    samples.sort()
    return statistics.median(samples), samples[max(0, round(len(samples) * 0.99) - 1)]


def main() -> None:
    import httpx
    import ray
    from ray.train._internal.state.state_actor import get_or_create_state_actor as ray_state_actor

    from elastrain.dashboard_api import create_app
    from elastrain.state import get_or_create_state_actor

    args = parse_args(__doc__ or "")
    sizes = (100, 1_000) if args.quick else (100, 10_000)
    context = ray.init(num_cpus=4, include_dashboard=True, log_to_driver=False)
    ray_url = "http://" + context.dashboard_url
    job_id = ray.get_runtime_context().get_job_id()
    node_id = ray.get_runtime_context().get_node_id()
    largest = 10_000 if args.quick else 100_000  # elastrain only
    theirs, ours = ray_state_actor(), get_or_create_state_actor(max_runs=2 * largest)

    import socket
    import threading

    import uvicorn

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)

    results: dict[tuple[str, int], tuple[float, float]] = {}
    stored = 0
    with httpx.Client(timeout=600) as client:
        for size in sizes:
            seed_ray(theirs, stored, size, job_id, node_id)
            seed_ours(ours, stored, size, job_id, node_id)
            stored = size
            results[("ours", size)] = latency(client, f"http://127.0.0.1:{port}/api/train/runs?limit=50", 100)
            ray_requests = 30 if size <= 1_000 else 5
            results[("ray", size)] = latency(client, f"{ray_url}/api/train/v2/runs", ray_requests)
            body = client.get(f"{ray_url}/api/train/v2/runs").json()
            assert len(body["train_runs"]) == size, "Ray's endpoint did not list every seeded run"
        for start in range(stored, largest, 10_000):
            seed_ours(ours, start, min(largest, start + 10_000), job_id, node_id)
        results[("ours", largest)] = latency(client, f"http://127.0.0.1:{port}/api/train/runs?limit=50", 100)
    server.should_exit = True
    thread.join(30)
    ray.shutdown()

    big, small = sizes[-1], sizes[0]
    rows = [
        Row(f"{big:,} stored runs", "page of 50, p50", results[("ours", big)][0], "Ray /api/train/v2/runs, p50",
            results[("ray", big)][0], 0.1),
        Row(f"{big:,} stored runs", "page of 50, p99", results[("ours", big)][1], "Ray /api/train/v2/runs, p99",
            results[("ray", big)][1], 0.1),
        Row(f"{small:,} stored runs", "page of 50, p50", results[("ours", small)][0], "Ray /api/train/v2/runs, p50",
            results[("ray", small)][0], None),
        Row("ours, growth", f"page of 50 at {big:,}, p50", results[("ours", big)][0], f"same at {small:,}",
            results[("ours", small)][0], None),
        Row("ours, growth", f"page of 50 at {largest:,}, p50", results[("ours", largest)][0], f"same at {small:,}",
            results[("ours", small)][0], 2.0),
        Row("ours, growth", f"page of 50 at {largest:,}, p99", results[("ours", largest)][1], f"same at {small:,}",
            results[("ours", small)][1], 2.0),
    ]  # fmt: skip
    notes = {
        "workers_per_run": WORKERS,
        "latency_s": {
            f"{who}@{size}": {"p50": round(v[0], 6), "p99": round(v[1], 6)} for (who, size), v in results.items()
        },
        "ray_endpoint": "GET /api/train/v2/runs (Ray Train state tracking on; token auth off for this cluster)",
    }
    write_results("dashboard", rows, args.output, notes=notes)


if __name__ == "__main__":
    main()
