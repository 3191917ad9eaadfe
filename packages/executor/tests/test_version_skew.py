"""A worker that runs other elastrain versions than its driver is refused at start, with both versions named.

The second node of a ``ray.cluster_utils.Cluster`` starts with ``PYTHONPATH`` naming a copy of this executor whose
``_version.py`` says 0.0.1, as a node with an older install would: its workers import that copy.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

import elastrain.executor
from elastrain.executor import RayExecutor, VersionMismatchError, elastic
from elastrain.executor._private.versions import mismatch, running_versions
from elastrain_testutils.ray_testing import NODE_DEFAULTS, local_cluster
from elastrain_testutils.waiting import wait_until

pytestmark = pytest.mark.cluster

OLD = "0.0.1"


@pytest.fixture(scope="module")
def older_install() -> Iterator[Path]:
    """A folder that, first on ``PYTHONPATH``, makes ``elastrain.executor`` an older release."""
    with tempfile.TemporaryDirectory(prefix="elastrain-older-") as folder:
        package = Path(folder) / "elastrain" / "executor"
        shutil.copytree(Path(elastrain.executor.__file__).parent, package, ignore=shutil.ignore_patterns("__pycache__"))
        (package / "_version.py").write_text(f'__version__ = "{OLD}"\n')
        yield Path(folder)


@pytest.fixture(scope="module")
def cluster(older_install: Path) -> Iterator[Any]:
    with local_cluster({"num_cpus": 1}, {"num_cpus": 1, "env_vars": {"PYTHONPATH": str(older_install)}}) as cluster:
        yield cluster


def test_versions_are_read_from_the_code_a_process_would_import() -> None:
    versions = dict(running_versions())
    assert versions["elastrain-executor"] == elastrain.executor.__version__
    assert "elastrain-discovery" in versions  # a dependency of the executor


def test_a_mismatch_names_both_versions_and_what_to_install() -> None:
    driver = (("elastrain-discovery", "0.1.0"), ("elastrain-executor", "0.2.0"))
    assert mismatch(driver, driver, "worker 1") is None
    assert mismatch(driver, (("elastrain-executor", "0.2.0"),), "worker 1") is None  # only what both have
    text = mismatch(driver, (("elastrain-discovery", "0.1.0"), ("elastrain-executor", "0.1.3")), "worker 1")
    assert text is not None
    assert "elastrain-executor 0.2.0 on the driver, 0.1.3 on worker 1" in text
    assert "pip install elastrain-executor==0.2.0" in text
    assert "discovery" not in text


def test_a_static_job_with_an_older_node_is_refused_at_start(cluster: Any) -> None:
    settings = RayExecutor.create_settings(timeout_s=60)
    executor = RayExecutor(settings, num_hosts=2, num_workers_per_host=1, cpus_per_worker=1)
    try:
        with pytest.raises(VersionMismatchError) as raised:
            executor.start()
    finally:
        executor.shutdown()
    text = str(raised.value)
    assert f"elastrain-executor {elastrain.executor.__version__} on the driver, {OLD} on the worker" in text, text
    assert f"pip install elastrain-executor=={elastrain.executor.__version__}" in text


def one_commit() -> int:
    state = elastic.ObjectState(step=0)

    @elastic.run
    def loop(state: elastic.ObjectState) -> int:
        state.step += 1
        state.commit()
        return int(state.step)

    return loop(state)


def test_an_elastic_job_with_an_older_node_is_refused_before_its_first_group(cluster: Any) -> None:
    settings = RayExecutor.create_settings(timeout_s=60)
    with RayExecutor(settings, min_workers=2, max_workers=2, cpus_per_worker=1, elastic_timeout=60) as executor:
        executor.start()
        with pytest.raises(VersionMismatchError, match=rf"elastrain-executor \S+ on the driver, {OLD} on worker"):
            executor.run(one_commit)


def train_until(stop_file: str) -> int:
    import os
    import time

    state = elastic.ObjectState(step=0)

    @elastic.run
    def loop(state: elastic.ObjectState) -> int:
        while not os.path.exists(stop_file):
            state.step += 1
            state.commit()
            open(stop_file + ".trained", "a").close()
            time.sleep(0.02)
        return int(state.step)

    return loop(state)


def test_a_node_with_an_older_install_that_joins_a_running_job_is_left_out(
    cluster: Any, older_install: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    [older] = [node for node in cluster.list_all_nodes() if node is not cluster.head_node]
    cluster.remove_node(older)
    stop_file = tmp_path / "stop"
    settings = RayExecutor.create_settings(timeout_s=60, discovery_interval_s=0.2)
    with RayExecutor(settings, min_workers=1, max_workers=2, cpus_per_worker=1, elastic_timeout=60) as executor:
        executor.start()
        with ThreadPoolExecutor(1) as pool:
            job = pool.submit(executor.run, train_until, [str(stop_file)])
            trained = Path(f"{stop_file}.trained")
            wait_until(trained.exists, timeout_s=60, what="a first step")
            cluster.add_node(**NODE_DEFAULTS, num_cpus=1, env_vars={"PYTHONPATH": str(older_install)})
            wait_until(lambda: "is left out of this job" in caplog.text, timeout_s=60, what="the older node refused")
            stop_file.touch()
            results = job.result(timeout=60)
    assert len(results) == 1, results  # it went on alone
    assert f"{OLD} on worker" in caplog.text
