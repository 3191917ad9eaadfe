"""The page in real headless Chromium (Debian's): lists runs, shows a run's workers, refreshes, clear states."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from elastrain.state import RunStatus, TrainRunInfo, TrainWorkerInfo, get_or_create_state_actor

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
        assert page.locator("#detail tbody tr").count() == 4
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
        assert token not in page.url
        assert page.evaluate("location.hash") == ""
        page.reload()  # the token stays with the tab, out of the address
        page.wait_for_selector("tr[data-run='run-0']", timeout=15_000)
        page.close()
        without = browser.new_page()
        without.goto(server.url + "/dash/")
        without.wait_for_selector("text=Open this page as .../#token=<token>", timeout=15_000)
        without.close()
