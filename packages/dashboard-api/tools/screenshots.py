"""The documentation's screenshots of the page: a running, a finished and an errored run (``nox -s screenshots``).

Starts a local Ray, fills a state actor of its own (not persisted) with runs like the demo's through
elastrain-state's public API (tests/demo_runs.py), serves the dashboard and photographs each run's view with
Playwright in Debian's Chromium. The running run's workers are live (idle) actors, so that they read ALIVE.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

PACKAGE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PACKAGE / "tests"))

import demo_runs  # noqa: E402 - the runs the page test uses too

SHOTS = {"running": "dashboard-running.png", "finished": "dashboard-finished.png", "errored": "dashboard-errored.png"}
VIEWPORT = {"width": 1440, "height": 1000}
PACE_S = 0.15  # between two reports: times over a few seconds, as a reader of the events list expects
WAIT_S = 60


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--output", type=Path, default=PACKAGE.parent.parent / "docs" / "images")
    parser.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    args = parser.parse_args()
    import ray

    ray.init(num_cpus=2, include_dashboard=False, namespace="elastrain-screenshots", log_to_driver=False)
    try:
        runs, _workers = record_runs()
        with serving() as url:
            photograph(url, runs, args.output, args.chromium)
    finally:
        ray.shutdown()
    for name in SHOTS.values():
        print(args.output / name)


def record_runs() -> tuple[dict[str, demo_runs.Recorded], list[Any]]:
    """The runs, and the actors standing in for the running run's workers (alive while referenced)."""
    import ray

    from elastrain.state import get_or_create_state_actor

    actor = get_or_create_state_actor(persist=False)

    @ray.remote(num_cpus=0)
    class IdleWorker:
        def ready(self) -> bool:
            return True

    idle = [IdleWorker.remote() for _ in range(4)]
    ray.get([w.ready.remote() for w in idle], timeout=WAIT_S)

    def live_worker(rank: int) -> dict[str, Any]:
        return demo_runs.worker(
            rank, f"a100-node-{rank + 1}", 31000 + 7 * rank, actor_id=idle[rank]._actor_id.hex(), gpus=(str(rank),)
        )

    runs = {
        "errored": demo_runs.errored_run(pace_s=PACE_S, actor=actor),
        "finished": demo_runs.finished_run(pace_s=PACE_S, actor=actor),
        "running": demo_runs.running_run(live_worker, pace_s=PACE_S, actor=actor),
    }
    deadline = time.monotonic() + WAIT_S
    while not all(demo_runs.recorded_in_full(actor, run) for run in runs.values()):
        if time.monotonic() > deadline:
            raise TimeoutError("The state actor did not get every report in time.")
        time.sleep(0.05)
    return runs, idle


class serving:
    """The dashboard app served by uvicorn on a free loopback port, in a thread."""

    def __enter__(self) -> str:
        import uvicorn

        from elastrain.dashboard_api import create_app

        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(create_app(), host="127.0.0.1", port=port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + WAIT_S
        while not self.server.started:
            if time.monotonic() > deadline:
                raise TimeoutError("uvicorn did not start")
            time.sleep(0.02)
        return f"http://127.0.0.1:{port}"

    def __exit__(self, *exc_info: object) -> None:
        self.server.should_exit = True
        self.thread.join(WAIT_S)


def photograph(url: str, runs: dict[str, demo_runs.Recorded], output: Path, chromium: str) -> None:
    from playwright.sync_api import sync_playwright

    output.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, headless=True, args=["--no-sandbox"])
        context = browser.new_context(viewport=VIEWPORT, locale="en-GB", timezone_id="UTC")
        page = context.new_page()
        problems: list[str] = []
        page.on("console", lambda message: problems.append(message.text) if message.type == "error" else None)
        page.on("pageerror", lambda error: problems.append(str(error)))
        for state, file_name in SHOTS.items():
            run_id = runs[state].run_id
            page.goto(f"{url}/#run={run_id}")
            page.wait_for_function(
                "id => window.elastrain.runId === id && Object.keys(window.elastrain.charts).length === 3",
                arg=run_id,
                timeout=WAIT_S * 1000,
            )
            page.wait_for_selector("#workers tbody tr", timeout=WAIT_S * 1000)
            page.mouse.move(0, 0)  # no hover highlight in the picture
            page.screenshot(path=str(output / file_name), full_page=True)
        browser.close()
    if problems:
        raise RuntimeError(f"The page reported errors: {problems}")


if __name__ == "__main__":
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    main()
