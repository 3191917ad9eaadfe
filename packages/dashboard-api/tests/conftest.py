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
    ship_by_value(request.module)
    with local_ray(num_cpus=4):
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

    def __init__(self, app: Any) -> None:
        import uvicorn

        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
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
    from elastrain.dashboard_api import create_app

    def start(**options: Any) -> Server:
        return Server(create_app(**options))

    return start
