"""A state actor that runs an older elastrain-state than the driver: the driver says both versions and what to do.

The cluster's state actor is detached, so it keeps the code it started with across upgrades. Here it runs a copy of
this package whose ``_version.py`` says 0.0.1 and whose schema is version 1 (its worker's ``PYTHONPATH`` names the
copy), as an actor started before an upgrade would.
"""

from __future__ import annotations

import logging
import re
import shutil
from pathlib import Path

import pytest

import elastrain.state
from elastrain.state import SCHEMA_VERSION, RunTracker, StateActor, get_or_create_state_actor
from elastrain.state._private import tracker as tracker_module

pytestmark = pytest.mark.usefixtures("no_state_actor")


@pytest.fixture
def older_state(tmp_path: Path) -> Path:
    """A folder that, first on ``PYTHONPATH``, makes ``elastrain.state`` release 0.0.1 with schema version 1."""
    package = tmp_path / "older" / "elastrain" / "state"
    shutil.copytree(Path(elastrain.state.__file__).parent, package, ignore=shutil.ignore_patterns("__pycache__"))
    (package / "_version.py").write_text('__version__ = "0.0.1"\n')
    schemas = package / "_private" / "schemas.py"
    schemas.write_text(re.sub(r"^SCHEMA_VERSION = \d+$", "SCHEMA_VERSION = 1", schemas.read_text(), flags=re.M))
    return tmp_path / "older"


def test_the_state_actor_says_which_versions_it_runs() -> None:
    import ray

    actor = get_or_create_state_actor(persist=False)  # held: Ray 2.40 drops a call on a handle no name holds
    info = ray.get(actor.info.remote(), timeout=30)
    assert (info["version"], info["schema_version"]) == (elastrain.state.__version__, SCHEMA_VERSION)


def test_an_older_state_actor_is_named_with_both_versions_and_what_to_do(
    older_state: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ray

    monkeypatch.setattr(tracker_module, "_warned", False)  # one warning per process: this test's
    older = (
        ray.remote(StateActor)
        .options(num_cpus=0, runtime_env={"env_vars": {"PYTHONPATH": str(older_state)}})
        .remote(100, None, 30.0, persist=False)
    )
    try:
        assert ray.get(older.info.remote(), timeout=60)["version"] == "0.0.1"
        tracker = RunTracker("skewed", actor=older)
        with caplog.at_level(logging.WARNING, logger="elastrain.state"):
            tracker.start()
            tracker.finish()
    finally:
        ray.kill(older, no_restart=True)
    text = caplog.text
    assert "runs elastrain-state 0.0.1 (schema 1)" in text, text
    assert f"older than this driver's elastrain-state {elastrain.state.__version__} (schema {SCHEMA_VERSION})" in text
    assert "ray.kill(elastrain.state.get_state_actor(), no_restart=True)" in text
    assert "Training goes on untracked" in text
