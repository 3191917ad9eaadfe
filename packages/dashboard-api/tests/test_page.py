"""The page in real headless Chromium (Debian's): lists runs, draws a run's charts with uPlot (vendored at build
time), lists its worker history and events, refreshes, clear states."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from demo_runs import CRASH_DETAIL, finished_run, recorded_in_full

from elastrain.state import RunStatus, TrainRunInfo, TrainWorkerInfo, get_or_create_state_actor
from elastrain_testutils.waiting import wait_until

pytestmark = pytest.mark.usefixtures("no_state_actor")
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = Path(os.environ.get("ELASTRAIN_TEST_ARTIFACTS", Path(__file__).parent.parent / ".test-artifacts"))
CHROMIUM_FLAGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync",
]  # fmt: skip


def a_run(index: int, status: RunStatus, workers: int = 0) -> dict[str, Any]:
    return TrainRunInfo(
        name=f"resnet-{index}", id=f"run-{index}", job_id="01", run_status=status, start_time_ms=1_000_000 + index,
        end_time_ms=None if status is RunStatus.RUNNING else 1_090_000 + index, world_size=workers, resets=index % 3,
        workers=tuple(
            TrainWorkerInfo(actor_id=f"{rank:032x}", world_rank=rank, local_rank=rank, node_rank=0, node_id="n" * 56,
                            node_ip="127.0.0.1", hostname="host", pid=100 + rank)
            for rank in range(workers)
        ),
    ).model_dump(mode="json")  # fmt: skip


@pytest.fixture
def browser() -> Any:
    from playwright.sync_api import sync_playwright

    if not os.path.exists(CHROMIUM):
        pytest.fail(
            f"Chromium is not installed at {CHROMIUM}: the dashboard-api nox session installs Debian's chromium"
        )
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_FLAGS)
        yield launched
        launched.close()


def test_page_lists_runs_and_shows_a_runs_workers(serve: Any, browser: Any) -> None:
    import ray

    with serve() as server:
        page = browser.new_page()
        page.goto(server.url + "/")
        page.wait_for_selector("text=Run tracking is off", timeout=15_000)  # the error state, before any run
        actor = get_or_create_state_actor()
        ray.get(
            [actor.register_run.remote(a_run(i, status, 4 if i == 2 else 0))
             for i, status in enumerate([RunStatus.FINISHED, RunStatus.ERRORED, RunStatus.RUNNING])],
            timeout=60,
        )  # fmt: skip
        page.wait_for_selector("tr[data-run='run-2']", timeout=15_000)  # refreshed by itself
        assert page.locator("tbody tr.run").count() == 3
        assert page.locator("tr[data-run='run-1'] .badge").inner_text() == "ERRORED"
        page.click("tr[data-run='run-2']")
        page.wait_for_selector("#detail h2:has-text('resnet-2')", timeout=15_000)
        assert page.locator("#workers tbody tr").count() == 4
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "dashboard.png"), full_page=True)
        page.close()
    assert (ARTIFACTS / "dashboard.png").stat().st_size > 10_000


def test_page_empty_state(serve: Any, browser: Any) -> None:
    get_or_create_state_actor()
    with serve() as server:
        page = browser.new_page()
        page.goto(server.url + "/")
        page.wait_for_selector("text=No training runs yet", timeout=15_000)
        page.close()


def test_page_under_a_prefix_reads_the_token_then_takes_it_out_of_the_address(serve_app: Any, browser: Any) -> None:
    import ray
    from fastapi import FastAPI

    from elastrain.dashboard_api import create_app

    token = "a-long-enough-page-token"  # noqa: S105
    actor = get_or_create_state_actor()
    ray.get(actor.register_run.remote(a_run(0, RunStatus.FINISHED)), timeout=60)
    outer = FastAPI()
    outer.mount("/dash", create_app(token=token))
    with serve_app(outer) as server:
        page = browser.new_page()
        page.goto(server.url + "/dash/#token=" + token)
        page.wait_for_selector("tr[data-run='run-0']", timeout=15_000)  # its requests went to /dash/api/...
        page.wait_for_function("typeof uPlot === 'function'", timeout=15_000)  # and its files came from /dash/static/
        assert token not in page.url
        assert page.evaluate("location.hash") == ""
        page.reload()  # the token stays with the tab, out of the address
        page.wait_for_selector("tr[data-run='run-0']", timeout=15_000)
        page.goto(server.url + "/dash/#token=" + token + "&run=run-0")  # a link to a run, with the token
        page.wait_for_selector("#detail h2:has-text('resnet-0')", timeout=15_000)
        assert page.evaluate("location.hash") == "#run=run-0"
        page.close()
        without = browser.new_page()
        without.goto(server.url + "/dash/")
        without.wait_for_selector("text=Open this page as .../#token=<token>", timeout=15_000)
        without.close()


def watch_for_errors(page: Any) -> list[str]:
    """Errors the page reports: script errors, failed loads, Content-Security-Policy refusals."""
    errors: list[str] = []
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: errors.append(str(error)))
    return errors


# Per chart, what uPlot holds and what the canvas shows: the x values (steps) with a value, the values, the
# markers drawn, and for each marker and each point whether its colour is on the canvas there.
CHARTS_SEEN = """probes => {
  const near = (ctx, x, y, color, r) => {
    const [R, G, B] = [1, 3, 5].map(i => parseInt(color.slice(i, i + 2), 16));
    const d = ctx.getImageData(Math.round(x) - r, Math.round(y) - r, 2 * r + 1, 2 * r + 1).data;
    for (let i = 0; i < d.length; i += 4) {
      const close = Math.abs(d[i] - R) < 40 && Math.abs(d[i + 1] - G) < 40 && Math.abs(d[i + 2] - B) < 40;
      if (d[i + 3] > 200 && close) return true;
    }
    return false;
  };
  // The share of a marker's column, top to bottom of the plot, in its colour (a dashed line: about 5 of 8).
  const column = (u, x, color) => {
    let hits = 0;
    for (let y = u.bbox.top + 12; y < u.bbox.top + u.bbox.height - 12; y++) hits += near(u.ctx, x, y, color, 0);
    return hits / (u.bbox.height - 24);
  };
  const charts = { ...window.elastrain.charts, "world size": window.elastrain.worldSize };
  const colors = { reset: "#7b1fa2", crashed: "#d93025", removed: "#e37400" };
  const seen = {};
  for (const [name, u] of Object.entries(charts)) {
    const stroke = u.series[1].stroke(u, 1);
    const steps = [], values = [], pointsDrawn = [];
    u.data[0].forEach((x, i) => {
      const y = u.data[1][i];
      if (y == null) return;
      steps.push(x); values.push(y);
      pointsDrawn.push(near(u.ctx, u.valToPos(x, "x", true), u.valToPos(y, "y", true), stroke, 2));
    });
    const markers = u.elastrainMarkers.map(m => ({ kind: m.kind, step: m.step }));
    // At the pixel column of each probed step, the share of each marker colour.
    const shares = {};
    for (const step of probes) {
      const x = u.valToPos(step, "x", true);
      shares[step] = Object.fromEntries(Object.entries(colors).map(([kind, color]) => [kind, column(u, x, color)]));
    }
    seen[name] = { steps, values, pointsDrawn, markers, shares, x: u.data[0] };
  }
  return seen;
}"""


def test_a_finished_demo_like_run_charts_its_metrics_with_resets_and_lists_the_crashed_worker(
    serve: Any, browser: Any
) -> None:
    """The demo's story: rank 1 crashes after step 50, the survivor goes on (reset 1), a replacement joins at
    step 60 (reset 2), the run finishes at 150. Recorded through RunTracker, as the executor records it."""
    actor = get_or_create_state_actor()
    recorded = finished_run(actor=actor)
    wait_until(lambda: recorded_in_full(actor, recorded), timeout_s=30, what="the run's reports and events")
    with serve() as server:
        page = browser.new_page(viewport={"width": 1440, "height": 1000})
        errors = watch_for_errors(page)
        page.goto(server.url + "/")
        page.click(f"tr[data-run='{recorded.run_id}']")
        page.wait_for_function(
            "id => window.elastrain.runId === id && window.elastrain.worldSize !== null", arg=recorded.run_id,
            timeout=15_000,
        )  # fmt: skip
        seen = page.evaluate(CHARTS_SEEN, [50, 60, 100])

        assert set(seen) == {"loss", "accuracy", "epoch", "world size"}
        for name in ("loss", "accuracy", "epoch"):
            chart = seen[name]
            assert chart["steps"] == recorded.steps, name  # a point at every reported step, none elsewhere
            assert chart["values"] == [recorded.values[step][name] for step in recorded.steps], name
            assert all(chart["pointsDrawn"]), f"{name}: points missing from the canvas at {chart['pointsDrawn']}"
        sizes = dict(zip(seen["world size"]["x"], seen["world size"]["values"], strict=True))
        assert [sizes[step] for step in (0, 45, 50, 55, 60, 150)] == [2, 2, 1, 1, 2, 2]
        for name, chart in seen.items():
            resets = [m for m in chart["markers"] if m["kind"] == "reset"]
            crashes = [m for m in chart["markers"] if m["kind"] == "crashed"]
            assert [m["step"] for m in resets] == recorded.reset_steps == [50, 60], name
            assert [m["step"] for m in crashes] == recorded.crash_steps == [50], name
            # On the canvas, at those steps' columns: reset lines are dashed, and the crash line at step 50 shows
            # between the dashes of the reset drawn over it. None at step 100.
            shares = chart["shares"]
            assert shares["50"]["reset"] > 0.4, (name, shares)
            assert shares["50"]["crashed"] > 0.1, (name, shares)
            assert shares["60"]["reset"] > 0.4, (name, shares)
            assert shares["60"]["crashed"] < 0.02, (name, shares)
            assert max(shares["100"].values()) < 0.02, (name, shares)

        crashed = page.locator(f"#workers tr[data-pid='{recorded.crashed[0]['pid']}']")
        assert crashed.locator(".badge").inner_text() == "CRASHED"
        for shown in ("trainer-b", CRASH_DETAIL, "step 50"):
            assert shown in crashed.inner_text()
        present = page.locator("#workers tr.present .badge").all_inner_texts()
        assert present == ["FINISHED", "FINISHED"]  # finished with the run, not DEAD
        workers_text = page.locator("#workers").inner_text()
        assert recorded.crashed[0]["node_id"] not in workers_text
        assert "DEAD" not in workers_text
        events = page.locator("#events li").all_inner_texts()
        assert len(events) == recorded.events
        assert any("rank 1 on trainer-b (pid 5151) crashed" in event for event in events)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "dashboard-run.png"), full_page=True)
        assert errors == []
        page.close()


def test_the_pages_files_are_served_with_their_policy(serve: Any) -> None:
    import httpx

    with serve() as server, httpx.Client(base_url=server.url, timeout=30) as http:
        page = http.get("/")
        policy = page.headers["content-security-policy"]
        assert "script-src 'self';" in policy
        assert "unsafe-inline" not in policy
        script = http.get("static/uplot/uPlot.iife.min.js")
        assert script.status_code == 200
        assert script.headers["content-type"].startswith("text/javascript")
        assert "uPlot" in script.text
        again = http.get("static/uplot/uPlot.iife.min.js", headers={"If-None-Match": script.headers["etag"]})
        assert (again.status_code, again.content) == (304, b"")
        assert "MIT" in http.get("static/uplot/LICENSE").text
        for name in ("page.js", "page.css", "uplot/uPlot.min.css"):
            assert http.get(f"static/{name}").status_code == 200, name
        for name in ("index.html", "uplot/VENDORED.json", "../_version.py", "%2e%2e/_version.py", "nope.js"):
            assert http.get(f"static/{name}").status_code == 404, name
