"""The main job: an elastic training run that loses a worker, recovers in place, and gets it back.

Everything starts here and is cleaned up at the end: a local Ray instance (or ``--address``), 2 workers
(elastic 1 to 3) training a small CNN on scikit-learn's digits with DistributedDataParallel (training.py),
state persisted every 10 commits to a local folder through elastrain-durable (or ``--storage s3://...``), the
run tracked by elastrain-state and served by the dashboard (its URL printed). Midway, one worker crashes, as
announced; the survivor goes on at once and the replacement joins. A summary gives the test accuracy, the
recovery times and the checkpoints kept.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import os
import shutil
import socket
import statistics
import sys
import tempfile
import threading
import time
from typing import Any

import training
from display import Display, showing, survivors_went_on

CRASH_STEP = 50  # the worker of rank 1 exits after this step: a reported one (a multiple of REPORT_EVERY)
MIN_EPOCHS = 6  # time enough after the crash for the replacement to join and train
LABEL = 30  # width of the summary's labels


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--address", default=None, help="an existing Ray cluster (default: start a local one)")
    parser.add_argument("--storage", default=None, help="where state is persisted (default: a local folder)")
    parser.add_argument("--epochs", type=int, default=10, help="epochs over the training digits (default: 10)")
    parser.add_argument("--port", type=int, default=8266, help="dashboard port (default: 8266, or a free one)")
    parser.add_argument("--linger", type=float, default=0, help="seconds to keep the dashboard up at the end")
    args = parser.parse_args()
    if args.epochs < MIN_EPOCHS:
        parser.error(f"--epochs must be at least {MIN_EPOCHS}, so that the crash and the recovery both happen")
    return args


def serve_dashboard(port: int) -> tuple[Any, str]:
    import uvicorn

    from elastrain.dashboard_api import create_app

    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: a past run's port is free
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(), host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    return server, f"http://127.0.0.1:{port}/"


def main() -> int:
    args = parse()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if not sys.stdout.isatty():
        os.environ.setdefault("RAY_COLOR_PREFIX", "0")  # whatever Ray prints goes to a log without colour codes
    import ray
    from ray import cloudpickle

    from elastrain.durable import CheckpointStore, StatePersistence
    from elastrain.executor import RayExecutor
    from elastrain.state import get_or_create_state_actor, get_state_actor

    cloudpickle.register_pickle_by_value(training)  # the workers cannot import this folder
    scratch = tempfile.mkdtemp(prefix="elastrain-demo-")
    storage = args.storage or os.path.join(scratch, "checkpoints")
    started_ray = args.address is None
    print("Starting Ray..." if started_ray else f"Connecting to {args.address}...", flush=True)
    # Quiet: the workers' output stays in Ray's log files and the driver's "ray" logger shows errors only.
    # A worker's exception still reaches this process as the executor's WorkerError.
    quiet = {"log_to_driver": False, "logging_level": logging.ERROR}
    if started_ray:
        ray.init(address="local", num_cpus=2, include_dashboard=False, **quiet)
    else:
        ray.init(address=args.address, **quiet)
    had_state_actor = get_state_actor() is not None
    get_or_create_state_actor()
    server, url = serve_dashboard(args.port)
    print(f"Dashboard: {url}\nCheckpoints: {storage}\n", flush=True)
    persistence = StatePersistence(storage, every=10, num_to_keep=3)
    display = Display(args.epochs, CRASH_STEP, training.PACE_S, sys.stdout)
    settings = RayExecutor.create_settings(timeout_s=60)
    began = time.time()
    try:
        executor = RayExecutor(settings, min_workers=1, max_workers=3, cpus_per_worker=1, elastic_timeout=120)
        with showing(display), executor:
            executor.start()
            results = executor.run(training.train, args=[args.epochs, persistence, CRASH_STEP], callbacks=[display])
        summarize(display, results, time.time() - began, storage, CheckpointStore)
        show_tracked_run(url)
        if args.linger > 0:
            print(f"\nThe dashboard stays up for {args.linger:.0f} s: {url}", flush=True)
            time.sleep(args.linger)
        return 0
    finally:
        server.should_exit = True
        if started_ray or not had_state_actor:
            actor = get_state_actor()
            if actor is not None and started_ray:
                ray.kill(actor, no_restart=True)
        ray.shutdown()
        shutil.rmtree(scratch, ignore_errors=True)


def row(label: str, value: str) -> None:
    print(f"  {label:<{LABEL}}{value}")


def summarize(display: Display, results: list[Any], wall_s: float, storage: str, store_class: Any) -> None:
    reports, crashed_at = display.reports, display.crashed_at
    result = results[0]
    print("\nSummary")
    row("test accuracy", f"{result['test_accuracy']:.1%} on {int(result['test_size'])} held-out digits")
    row("training", f"{display.epochs} epochs, {int(result['step'])} steps, {wall_s:.1f} s")
    row("resets", f"{max(r['resets'] for r in reports)} (the crash, then the replacement joining)")
    if crashed_at is not None:
        after = [r for r in reports if r["time"] > crashed_at]
        back = [r for r in after if r["size"] > after[0]["size"]]
        if after:
            row("crash -> next step", f"{after[0]['time'] - crashed_at:.2f} s ({survivors_went_on(after[0]['size'])})")
        if back:
            row("crash -> replacement joined", f"{back[0]['time'] - crashed_at:.2f} s")
    else:
        row("crash", "did not happen: the job never had 2 workers at the planned step")
    lost_s, redone = time_lost_to_recovery(reports)
    row("time lost to recovery", f"{lost_s:.2f} s (stalls while groups re-formed; {redone} steps redone)")
    with store_class(storage) as store:
        kept = store.list()
    steps = ", ".join(str(c.step) for c in kept)
    row("checkpoints kept", f"{len(kept)}: steps {steps} (persisted every 10 commits)")


def time_lost_to_recovery(reports: list[dict[str, Any]]) -> tuple[float, int]:
    """Wall time the resets cost: across each reset, how much longer the steps took than at the usual pace of
    their world (a reset's stall, and any steps done twice after a rollback to the last commit)."""
    pairs = list(itertools.pairwise(reports))
    pace: dict[int, list[float]] = {}
    for earlier, later in pairs:
        steps = later["step"] - earlier["step"]
        if (earlier["resets"], earlier["size"]) == (later["resets"], later["size"]) and steps > 0:
            pace.setdefault(later["size"], []).append((later["time"] - earlier["time"]) / steps)
    if not pace:
        return 0.0, 0
    usual = {size: statistics.median(paces) for size, paces in pace.items()}
    overall = statistics.median(itertools.chain(*pace.values()))
    lost, redone = 0.0, 0
    for earlier, later in pairs:
        if (earlier["resets"], earlier["size"]) == (later["resets"], later["size"]):
            continue
        steps = later["step"] - earlier["step"]
        redone += max(0, 1 - steps)
        expected = max(0, steps) * usual.get(later["size"], overall)
        lost += max(0.0, later["time"] - earlier["time"] - expected)
    return lost, redone


def show_tracked_run(url: str) -> None:
    """What the dashboard's API says about the run, read over HTTP like any client would."""
    import json
    import urllib.request

    with urllib.request.urlopen(url + "api/train/runs?limit=1", timeout=10) as response:  # noqa: S310 - our own
        runs = json.load(response)["runs"]
    if runs:
        run = runs[0]
        workers = ", ".join(f"rank {w['world_rank']} pid {w['pid']} {w['status']}" for w in run["workers"])
        row("tracked run", f"{run['name']}: {run['run_status']}, {run['resets']} resets; workers: {workers}")


if __name__ == "__main__":
    raise SystemExit(main())
