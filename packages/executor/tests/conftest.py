from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from elastrain_testutils.ray_testing import local_ray, ship_by_value

# The elastic driver raises on an illegal phase transition here (production logs it and goes on).
os.environ["ELASTRAIN_STRICT_PROTOCOL"] = "1"


@pytest.fixture(scope="module")
def ray_4_cpus() -> Iterator[None]:
    """One local Ray node with 4 CPUs, shared by a test module."""
    with local_ray(num_cpus=4):
        yield


@pytest.fixture(scope="module")
def ray_with_scripted_hosts() -> Iterator[None]:
    """One local Ray node whose fake ``node:host-N`` resources stand for the elastic-training tests' hosts."""
    from elastic_training_kit import HOSTS

    with local_ray(num_cpus=4, resources=HOSTS):
        yield


@pytest.fixture
def crash_dir() -> Iterator[Path]:
    """A folder for ``crash-<rank>-<step>`` files: a worker exits hard where one names it (crash_if_marked)."""
    with tempfile.TemporaryDirectory(prefix="elastrain-crash-") as folder:
        yield Path(folder)


@pytest.fixture(autouse=True, scope="module")
def _functions_travel_by_value(request: pytest.FixtureRequest) -> None:
    ship_by_value(request.module)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    model = sys.modules.get("test_driver_core_model")
    if model is not None and model.COUNTS["sequences"]:
        terminalreporter.write_line(model.summary())
