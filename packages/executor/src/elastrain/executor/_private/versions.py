"""Which elastrain versions a process runs, and the check that every worker runs the driver's.

The driver and its workers talk through private calls, pickled objects and actors whose shape changes between
any two releases, so, as Ray does for its own version, a worker must run exactly the driver's version of every
elastrain distribution that both have. Versions are read from the ``_version.py`` that each package would
import from (not from installed metadata), so a node whose ``PYTHONPATH`` shadows an install is seen as it runs;
nothing is imported, so reading them costs well under a millisecond.
"""

from __future__ import annotations

import functools
import importlib.util
import re
from pathlib import Path

# Import name under elastrain -> distribution.
DISTRIBUTIONS = {
    "discovery": "elastrain-discovery",
    "executor": "elastrain-executor",
    "durable": "elastrain-durable",
    "state": "elastrain-state",
    "dashboard_api": "elastrain-dashboard-api",
    "tune": "elastrain-tune",
}
_VERSION = re.compile(r'^__version__ = "([^"]+)"$', re.MULTILINE)


@functools.cache
def running_versions() -> tuple[tuple[str, str], ...]:
    """``(distribution, version)`` of every elastrain package this process would import, in a fixed order."""
    found = []
    for name, distribution in DISTRIBUTIONS.items():
        try:
            spec = importlib.util.find_spec(f"elastrain.{name}")
        except (ImportError, ValueError):
            continue
        if spec is None or not spec.submodule_search_locations:
            continue
        for folder in spec.submodule_search_locations:
            version_file = Path(folder) / "_version.py"
            match = _VERSION.search(version_file.read_text()) if version_file.is_file() else None
            if match:
                found.append((distribution, match.group(1)))
                break
    return tuple(found)


def mismatch(driver: tuple[tuple[str, str], ...], worker: tuple[tuple[str, str], ...], where: str) -> str | None:
    """What differs between the driver's versions and a worker's (``where``: which worker), or None."""
    theirs = dict(worker)
    differing = [(dist, ours, theirs[dist]) for dist, ours in driver if dist in theirs and theirs[dist] != ours]
    if not differing:
        return None
    listed = "; ".join(f"{dist} {ours} on the driver, {other} on {where}" for dist, ours, other in differing)
    pins = " ".join(f"{dist}=={ours}" for dist, ours, _ in differing)
    return (
        f"elastrain versions differ between the driver and a worker: {listed}. Every node must run the driver's "
        f"elastrain versions: install them there (pip install {pins}), or start the driver where the workers' "
        "versions are installed."
    )
