"""The main job: an elastic training run that loses a worker, recovers in place, and gets it back.

Everything starts here and is cleaned up at the end: a local Ray instance (or ``--address``), 2 workers
(elastic 1 to 3), a small model on synthetic data, state persisted every 10 commits to a local folder through
elastrain-durable (or ``--storage s3://...``), the run tracked by elastrain-state and served by the dashboard
(its URL printed). Midway, one worker crashes; the survivor goes on at once and the replacement joins.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

CRASH_AT = 60
BATCH = 64


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--address", default=None, help="an existing Ray cluster (default: start a local one)")
    parser.add_argument("--storage", default=None, help="where state is persisted (default: a local folder)")
    parser.add_argument("--steps", type=int, default=160, help="training steps (default: 160)")
    parser.add_argument("--port", type=int, default=8266, help="dashboard port (default: 8266, or a free one)")
    parser.add_argument("--linger", type=float, default=0, help="seconds to keep the dashboard up at the end")
    args = parser.parse_args()
    if args.steps <= CRASH_AT + 20:
        parser.error(f"--steps must be above {CRASH_AT + 20}, so that the crash and the recovery both happen")
    return args


def train(steps: int, crash_marker: str, persistence: Any) -> dict[str, float]:
    """Runs on every worker: a tiny regression model, gradients averaged with torch.distributed."""
    import torch
    import torch.distributed as dist

    from elastrain.executor import elastic, send

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    state = elastic.TorchState(model=model, optimizer=optimizer, step=0, resets=0)
    state.persist_with(persistence)
    state.register_reset_callbacks([lambda: setattr(state, "resets", state.resets + 1)])
    true_weights = torch.linspace(-1.0, 1.0, 8)

    @elastic.run
    def loop(state: elastic.TorchState) -> dict[str, float]:
        loss = torch.tensor(0.0)
        while state.step < steps:
            rank, size = dist.get_rank(), dist.get_world_size()
            if state.step == CRASH_AT and rank == 1 and not os.path.exists(crash_marker):
                Path(crash_marker).write_text(str(time.time()))
                os._exit(1)  # a worker crashes, as if its process was killed
            generator = torch.Generator().manual_seed(state.step * 1000 + rank)
            inputs = torch.randn(BATCH, 8, generator=generator)
            targets = (inputs @ true_weights).unsqueeze(1)
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(inputs), targets)
            loss.backward()
            for parameter in model.parameters():
                dist.all_reduce(parameter.grad)
                parameter.grad /= size
            optimizer.step()
            state.step += 1
            if rank == 0:
                send({"step": state.step, "loss": float(loss), "size": size, "resets": state.resets, "t": time.time()})
            time.sleep(0.05)  # a real step takes longer; this keeps the demo watchable
            state.commit()
        return {"step": float(state.step), "loss": float(loss)}

    result: dict[str, float] = loop(state)
    return result


class Progress:
    """One line: a bar, step, loss, world size and resets; steps are remembered for the summary."""

    def __init__(self, steps: int) -> None:
        self.steps = steps
        self.live = sys.stdout.isatty()  # redraw one line on a terminal; a line every 20 steps in a log
        self.seen: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def __call__(self, message: dict[str, Any]) -> None:
        with self.lock:
            if self.seen and message["size"] != self.seen[-1]["size"]:
                old, new = self.seen[-1]["size"], message["size"]
                sys.stdout.write(f"\n  world size {old} -> {new} at step {message['step']}\n")
            self.seen.append(message)
            bar = "#" * int(message["step"] / self.steps * 30)
            line = (
                f"[{bar:<30}] step {message['step']:>4}/{self.steps}  loss {message['loss']:.4f}  "
                f"world size {message['size']}  resets {message['resets']}"
            )
            if self.live:
                sys.stdout.write("\r" + line)
            elif message["step"] % 20 == 0 or message["step"] == self.steps:
                sys.stdout.write(line + "\n")
            sys.stdout.flush()


def serve_dashboard(port: int) -> tuple[Any, str]:
    import uvicorn

    from elastrain.dashboard_api import create_app

    with socket.socket() as probe:
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
    import ray

    from elastrain.durable import CheckpointStore, StatePersistence
    from elastrain.executor import RayExecutor
    from elastrain.state import get_or_create_state_actor, get_state_actor

    scratch = tempfile.mkdtemp(prefix="elastrain-demo-")
    storage = args.storage or os.path.join(scratch, "checkpoints")
    started_ray = args.address is None
    print("Starting Ray..." if started_ray else f"Connecting to {args.address}...", flush=True)
    if started_ray:
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    else:
        ray.init(address=args.address, log_to_driver=False)
    had_state_actor = get_state_actor() is not None
    get_or_create_state_actor()
    server, url = serve_dashboard(args.port)
    print(f"Dashboard: {url}\nCheckpoints: {storage}\n", flush=True)
    progress = Progress(args.steps)
    persistence = StatePersistence(storage, every=10, num_to_keep=3)
    marker = os.path.join(scratch, "crashed")
    settings = RayExecutor.create_settings(timeout_s=60)
    began = time.time()
    try:
        with RayExecutor(settings, min_workers=1, max_workers=3, cpus_per_worker=1, elastic_timeout=120) as executor:
            executor.start()
            results = executor.run(train, args=[args.steps, marker, persistence], callbacks=[progress])
        summarize(progress, results, began, marker, storage, CheckpointStore)
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


def show_tracked_run(url: str) -> None:
    """What the dashboard's API says about the run, read over HTTP like any client would."""
    import json
    import urllib.request

    with urllib.request.urlopen(url + "api/train/runs?limit=1", timeout=10) as response:  # noqa: S310 - our own
        runs = json.load(response)["runs"]
    if runs:
        run = runs[0]
        workers = ", ".join(f"rank {w['world_rank']} pid {w['pid']} {w['status']}" for w in run["workers"])
        print(f"  tracked run     {run['name']}: {run['run_status']}, {run['resets']} resets; workers: {workers}")


def time_lost_to_recovery(seen: list[dict[str, Any]]) -> tuple[float, int]:
    """Wall time recovery cost the run: how much longer than a normal step each step across a reset or a resize
    took, plus the time of steps done twice (after a rollback to the last commit)."""
    import itertools
    import statistics

    if len(seen) < 3:
        return 0.0, 0
    pairs = list(itertools.pairwise(seen))
    normal = statistics.median(later["t"] - earlier["t"] for earlier, later in pairs)
    lost, redone = 0.0, 0
    for earlier, later in pairs:
        gap = later["t"] - earlier["t"]
        if later["step"] <= earlier["step"]:
            redone += earlier["step"] - later["step"] + 1
        if later["resets"] != earlier["resets"] or later["size"] != earlier["size"]:
            lost += max(0.0, gap - normal)
    return lost + redone * normal, redone


def summarize(
    progress: Progress, results: list[Any], began: float, marker: str, storage: str, store_class: Any
) -> None:
    seen = progress.seen
    crashed_at = float(Path(marker).read_text()) if os.path.exists(marker) else None
    print("\n\nSummary")
    print(f"  steps           {int(results[0]['step'])}, final loss {results[0]['loss']:.4f}")
    print(f"  wall time       {time.time() - began:.1f} s")
    print(f"  resets          {max(m['resets'] for m in seen)} (the crash, then the replacement joining)")
    if crashed_at is not None:
        after = [m for m in seen if m["t"] > crashed_at]
        back = [m for m in after if m["size"] == 2]
        if after:
            print(f"  crash -> next step            {after[0]['t'] - crashed_at:.2f} s (the survivor went on alone)")
        if back:
            print(f"  crash -> replacement joined   {back[0]['t'] - crashed_at:.2f} s")
    lost_s, redone = time_lost_to_recovery(seen)
    print(f"  time lost to recovery         {lost_s:.2f} s (stalls while groups re-formed; {redone} steps redone)")
    with store_class(storage) as store:
        kept = store.list()
    print(f"  checkpoints kept {len(kept)}: steps {', '.join(str(c.step) for c in kept)} (persisted every 10 commits)")


if __name__ == "__main__":
    raise SystemExit(main())
