"""A HostManager polling Ray stops quietly once Ray is gone: shut down, or at the end of a script that never
called ``stop()`` (Horovod's examples don't)."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time

import pytest

from elastrain.discovery import (
    HostDiscoveryClosedError,
    HostDiscoveryError,
    HostManager,
    HostManagerStoppedError,
    RayHostDiscovery,
)
from elastrain_testutils.ray_testing import local_ray
from elastrain_testutils.waiting import wait_until


def test_polling_ends_quietly_when_ray_shuts_down(caplog: pytest.LogCaptureFixture) -> None:
    waiter_error: list[BaseException] = []
    with local_ray(num_cpus=2):
        manager = HostManager(RayHostDiscovery(), poll_interval_s=0.05).start()
        hosts = manager.current_hosts
        assert len(hosts) == 1

        def wait_for_more_slots() -> None:
            try:
                manager.wait_for_slots(100, timeout_s=60)
            except BaseException as error:
                waiter_error.append(error)

        waiter = threading.Thread(target=wait_for_more_slots, daemon=True)
        waiter.start()
        caplog.set_level(logging.DEBUG, logger="elastrain.discovery")
    # Ray is shut down here; the manager was never stopped
    wait_until(lambda: not manager.running, timeout_s=10, what="the poll thread to end")
    thread = manager._thread
    assert thread is not None
    thread.join(5)
    assert not thread.is_alive()
    assert isinstance(manager.last_error, HostDiscoveryClosedError)
    assert manager.current_hosts == hosts  # the last known hosts stay
    waiter.join(10)
    assert len(waiter_error) == 1
    assert isinstance(waiter_error[0], HostManagerStoppedError)
    assert "Ray was shut down" in str(waiter_error[0])
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    manager.stop()  # still fine afterwards


def test_before_ray_starts_the_error_is_not_final() -> None:
    with pytest.raises(HostDiscoveryError, match=r"call ray\.init\(\)") as caught:
        RayHostDiscovery().find_available_hosts()
    assert not isinstance(caught.value, HostDiscoveryClosedError)


SCRIPT = """
import logging, time
logging.basicConfig(level=logging.INFO)
import ray
ray.init(address="local", include_dashboard=False, num_cpus=1, object_store_memory=80 * 1024 * 1024)
from elastrain.discovery import HostManager, RayHostDiscovery
manager = HostManager(RayHostDiscovery(), poll_interval_s=0.02).start()
time.sleep(0.5)
print("hosts", len(manager.current_hosts), flush=True)
"""


def test_a_script_that_never_stops_the_manager_exits_quietly() -> None:
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert "hosts 1" in done.stdout
    assert "elastrain.discovery" not in done.stderr, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert "Logging error" not in done.stderr, done.stderr
    assert time.monotonic() - start < 60
