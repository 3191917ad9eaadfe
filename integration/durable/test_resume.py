"""An elastic job persists its state to a real object store (S3 or GCS: ``ELASTRAIN_SCENARIO_STORAGE``); its
driver is killed mid-run, the hard way, and a new driver resumes from the latest committed state and finishes
with exactly the weights of a run that never failed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kit.training import reference

from elastrain.durable import CheckpointStore
from elastrain_testutils.storage_servers import FakeGcs, SeaweedS3
from elastrain_testutils.waiting import wait_until

# gcsfs asks GCS for hierarchical-namespace facts that fake-gcs-server lacks; workers inherit this setting.
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
STEPS = 150
DRIVER = Path(__file__).with_name("driver.py")


@pytest.fixture(scope="module")
def storage() -> Iterator[tuple[str, dict[str, Any]]]:
    """(uri, storage_options) of a fresh bucket on a real server of the kind this scenario names."""
    kind = os.environ.get("ELASTRAIN_SCENARIO_STORAGE", "s3")
    server = SeaweedS3() if kind == "s3" else FakeGcs()
    with server:
        server.create_bucket("elastrain-scenario")
        yield f"{kind}://elastrain-scenario/job", server.storage_options()


@pytest.fixture(scope="module")
def cluster_address() -> Iterator[str]:
    """A Ray cluster that outlives the drivers, as a real one does (this process does not connect to it)."""
    from ray.cluster_utils import Cluster

    from elastrain_testutils.ray_testing import NODE_DEFAULTS

    cluster = Cluster(initialize_head=True, head_node_args={**NODE_DEFAULTS, "num_cpus": 2, "include_dashboard": False})
    try:
        yield cluster.address
    finally:
        cluster.shutdown()


class Driver:
    def __init__(self, address: str, uri: str, options: dict[str, Any], log: Path) -> None:
        self.log = log
        command = [sys.executable, str(DRIVER), "--address", address, "--uri", uri, "--steps", str(STEPS)]
        command += ["--storage-options", json.dumps(options)]
        with open(log, "wb") as output:
            self.process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, start_new_session=True)

    def lines(self) -> list[str]:
        return self.log.read_text(errors="replace").splitlines()

    def steps(self) -> list[int]:
        return [int(line.split()[1]) for line in self.lines() if line.startswith("STEP ")]

    def result(self, timeout_s: float) -> list[dict[str, Any]]:
        try:
            code = self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"The driver did not finish in {timeout_s} s:\n{self.tail()}") from None
        assert code == 0, f"The driver exited with {code}:\n{self.tail()}"
        found = [line for line in self.lines() if line.startswith("RESULT ")]
        assert len(found) == 1, f"The driver printed {len(found)} RESULT lines:\n{self.tail()}"
        results: list[dict[str, Any]] = json.loads(found[0].removeprefix("RESULT "))
        return results

    def kill(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(30)

    def tail(self) -> str:
        return "\n".join(self.lines()[-40:])


def test_a_killed_driver_resumes_from_the_latest_commit(
    storage: tuple[str, dict[str, Any]], cluster_address: str, tmp_path: Path
) -> None:
    uri, options = storage
    store = CheckpointStore(uri, storage_options=options)
    first = Driver(cluster_address, uri, options, tmp_path / "first.log")
    try:
        # Two persisted states and the job past step 40: the kill lands mid-run, with uploads in flight.
        def mid_run() -> bool:
            return len(store.list()) >= 2 and max(first.steps(), default=0) >= 40

        wait_until(
            lambda: mid_run() or first.process.poll() is not None,
            timeout_s=180,
            what="the first driver to persist two states",
            interval_s=0.2,
        )
        assert first.process.poll() is None, f"The first driver ended early:\n{first.tail()}"
        committed_before_kill = [c.step for c in store.list()]
    finally:
        first.kill()
    reached = max(first.steps())
    assert reached < STEPS

    # Ray ends the dead driver's workers shortly after it; until then they may still commit (and collect).
    listings: list[list[str]] = []

    def settled() -> bool:
        listings.append([c.name for c in store.list()])
        return len(listings) > 15 and all(listing == listings[-1] for listing in listings[-15:])

    wait_until(settled, timeout_s=120, what="the store to stop changing after the kill", interval_s=0.2)

    # Everything committed before the kill is still there; an upload cut off by it never shows as committed.
    # Looked at as a new process would: the kill may cut a collection short, and `store` still remembers the
    # checkpoint that collection had uncommitted.
    after_kill = CheckpointStore(uri, storage_options=options)
    latest = after_kill.latest()
    assert latest is not None
    assert latest.step >= max(committed_before_kill)
    for checkpoint in after_kill.list():
        after_kill.restore(checkpoint.name, local_dir=tmp_path / f"verify-{checkpoint.step}")
    after_kill.close()

    second = Driver(cluster_address, uri, options, tmp_path / "second.log")
    try:
        results = second.result(timeout_s=300)
    finally:
        second.kill()
    resumed_at = {r["first_step"] for r in results}
    # Every worker resumed from the latest committed state (checkpoint steps count commits, one per step).
    assert resumed_at == {latest.step}, f"resumed from {resumed_at}, latest committed {latest}:\n{second.tail()}"
    assert min(second.steps()) == latest.step + 1
    assert max(second.steps()) == STEPS
    expected = reference(STEPS)
    for result in results:
        assert result["weights"] == pytest.approx(expected, rel=1e-9, abs=1e-12)
    store.close()
