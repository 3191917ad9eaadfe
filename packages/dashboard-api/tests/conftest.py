from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from elastrain.state import get_state_actor
from elastrain_testutils.ray_testing import local_ray, ship_by_value
from elastrain_testutils.waiting import wait_until


@pytest.fixture(scope="module")
def ray_4_cpus(request: pytest.FixtureRequest) -> Iterator[None]:
    """One Ray for the module; a module's ``RAY_SYSTEM_CONFIG`` (a dict) is passed to Ray as its system config."""
    ship_by_value(request.module)
    with local_ray(num_cpus=4, _system_config=getattr(request.module, "RAY_SYSTEM_CONFIG", None)):
        yield


def remove_state_actor() -> None:
    import ray

    actor = get_state_actor()
    if actor is not None:
        ray.kill(actor, no_restart=True)
        wait_until(lambda: get_state_actor() is None, timeout_s=30, what="the state actor to go")


@pytest.fixture
def no_state_actor(ray_4_cpus: None) -> Iterator[None]:
    remove_state_actor()
    yield
    remove_state_actor()


class Server:
    """The app served by uvicorn on 127.0.0.1 in a thread: a real HTTP server."""

    def __init__(self, app: Any, **config: Any) -> None:
        import uvicorn

        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", **config)
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> Server:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline:
                raise TimeoutError("uvicorn did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.server.should_exit = True
        self.thread.join(30)


@pytest.fixture
def serve() -> Any:
    """``serve(**create_app_options, server_config={...uvicorn options})``: a Server of a new app."""
    from elastrain.dashboard_api import create_app

    def start(server_config: dict[str, Any] | None = None, **options: Any) -> Server:
        return Server(create_app(**options), **(server_config or {}))

    return start


@pytest.fixture
def serve_app() -> Any:
    """``serve_app(app, **uvicorn_options)``: a Server of a given ASGI app (e.g. one that mounts the dashboard)."""
    return Server
