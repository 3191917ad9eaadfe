"""The scenario's side of a job: what the workers said about themselves, and the dashboard as users run it."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from elastrain_testutils.storage_servers import free_port
from elastrain_testutils.waiting import wait_until


class Truth:
    """A job callback recording what the workers themselves reported (see ``kit.training.train``): each rank's
    latest message, every world size seen in order, and the highest step."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.latest: dict[int, dict[str, Any]] = {}
        self.sizes: list[int] = []
        self.step = 0

    def __call__(self, message: dict[str, Any]) -> None:
        with self.lock:
            self.latest[message["rank"]] = message
            if not self.sizes or self.sizes[-1] != message["size"]:
                self.sizes.append(message["size"])
            self.step = max(self.step, message["step"])

    @property
    def size(self) -> int:
        with self.lock:
            return self.sizes[-1] if self.sizes else 0

    def workers(self, size: int) -> set[tuple[int, int, str]]:
        """(rank, pid, node) of ranks below ``size`` as they last reported: the workers of a job of that size."""
        with self.lock:
            return {(m["rank"], m["pid"], m["node"]) for rank, m in self.latest.items() if rank < size}

    def resets(self) -> int:
        """The fewest resets any current rank has seen (a new worker learns the count when it joins)."""
        with self.lock:
            size = self.sizes[-1] if self.sizes else 0
            return min((m["resets"] for rank, m in self.latest.items() if rank < size), default=0)

    def settled(self, size: int, resets_above: int) -> bool:
        """Every rank of a job of ``size`` has reported since a reset beyond ``resets_above``."""
        with self.lock:
            current = [m for rank, m in self.latest.items() if rank < size]
            return (
                bool(self.sizes)
                and self.sizes[-1] == size
                and len(current) == size
                and all(m["size"] == size and m["resets"] > resets_above for m in current)
            )

    def pid_of(self, rank: int) -> int:
        with self.lock:
            return int(self.latest[rank]["pid"])


def shown_workers(run: dict[str, Any]) -> set[tuple[int, int, str]]:
    """(rank, pid, node) of the workers a run record from the dashboard's API shows alive."""
    return {(w["world_rank"], w["pid"], w["node_id"]) for w in run["workers"] if w["status"] == "ALIVE"}


@contextlib.contextmanager
def dashboard(address: str, log: Path) -> Iterator[Any]:
    """``elastrain-dashboard`` started as users start it, connected to ``address``; yields an httpx client."""
    import httpx

    port = free_port()
    command = [str(Path(sys.executable).with_name("elastrain-dashboard")), "--address", address, "--port", str(port)]
    with open(log, "wb") as output:
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT)
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10)

    def healthy() -> bool:
        assert process.poll() is None, f"elastrain-dashboard exited:\n{log.read_text()}"
        try:
            return client.get("/healthz").status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_until(healthy, timeout_s=60, what="the dashboard to answer", interval_s=0.2)
        yield client
    finally:
        client.close()
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(30)


class RunView:
    """One run as the dashboard's API shows it, remembering the last answer so a failed wait can say what the
    API said (not found, tracking off, unreachable, or a run that differs from the truth)."""

    def __init__(self, client: Any, run_id: Callable[[], str | None]) -> None:
        self.client = client
        self.run_id = run_id
        self.last: str = "nothing yet"

    def fetch(self) -> dict[str, Any] | None:
        import httpx

        run_id = self.run_id()
        if not run_id:
            self.last = "no run id yet (the call has not started)"
            return None
        try:
            response = self.client.get(f"/api/train/runs/{run_id}")
        except httpx.TransportError as error:
            self.last = f"no answer ({error!r})"
            return None
        if response.status_code != 200:
            self.last = f"{response.status_code} {response.text[:500]}"
            return None
        run: dict[str, Any] = response.json()
        self.last = f"200 {run}"
        return run

    def wait(
        self,
        condition: Callable[[dict[str, Any]], bool],
        *,
        timeout_s: float,
        what: str,
        context: Callable[[], object] = lambda: "",
    ) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            run = self.fetch()
            return run if run is not None and condition(run) else None

        try:
            return wait_until(check, timeout_s=timeout_s, what=what, interval_s=0.1)
        except AssertionError as error:
            raise AssertionError(f"{error}\nThe API last answered: {self.last}\n{context()}") from None
