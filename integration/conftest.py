"""Shared by every scenario: the ``kit`` package travels to Ray's workers by value, and Ray stays quiet."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import kit.training

from elastrain_testutils.ray_testing import ship_by_value

ship_by_value(kit.training)


@pytest.fixture(autouse=True, scope="module")
def _test_functions_travel_by_value(request: pytest.FixtureRequest) -> None:
    ship_by_value(request.module)
