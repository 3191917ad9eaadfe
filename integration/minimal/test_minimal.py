"""Only elastrain-discovery and elastrain-executor installed: static and elastic jobs work, nothing else is
needed (no pydantic, no numpy, no other elastrain package), and the executor runs untracked without complaint.

This is the install the executor's README gives (``elastrain-executor`` plus ``torch``): an elastic reset here
syncs state between workers that have no numpy."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kit.observing import Truth
from kit.training import reference, train

from elastrain.discovery import RayHostDiscovery
from elastrain.executor import RayExecutor, context
from elastrain_testutils.ray_testing import local_ray

# torch says once, on import, that it runs without numpy: that is what this scenario checks works.
pytestmark = pytest.mark.filterwarnings("ignore:Failed to initialize NumPy:UserWarning")


@pytest.fixture(scope="module", autouse=True)
def ray_2_cpus() -> Iterator[None]:
    with local_ray(num_cpus=2):
        yield


@pytest.mark.parametrize(
    "name", ["pydantic", "numpy", "elastrain.state", "elastrain.durable", "elastrain.dashboard_api"]
)
def test_only_the_named_packages_are_installed(name: str) -> None:
    parent = name.rpartition(".")[0]
    if parent:
        importlib.import_module(parent)  # the namespace itself resolves
    assert importlib.util.find_spec(name) is None, f"{name} is installed in the minimal scenario"


def allreduce_ranks() -> tuple[int, int, float]:
    import torch
    import torch.distributed as dist

    from elastrain.executor import init_process_group

    init_process_group()
    total = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(total)
    return context().rank, dist.get_world_size(), float(total.item())


def test_static_job() -> None:
    settings = RayExecutor.create_settings(timeout_s=60)
    with RayExecutor(settings, num_workers=2, cpus_per_worker=0.5) as executor:
        executor.start()
        assert executor.run(allreduce_ranks) == [(0, 2, 3.0), (1, 2, 3.0)]
        assert [p.rank for p in executor.placements] == [0, 1]


def test_discovery_sees_this_machine() -> None:
    hosts = RayHostDiscovery(cpus_per_worker=1).find_available_hosts_and_slots()
    assert sum(hosts.values()) == 2, hosts


def test_elastic_job_recovers_from_a_crash_and_loses_nothing(tmp_path: Path) -> None:
    (tmp_path / "crash-1-40").touch()  # rank 1 exits hard at step 40
    stop_file = tmp_path / "stop"
    truth = Truth()
    last_step: list[int] = []

    def stop_once_recovered(message: dict[str, Any]) -> None:
        truth(message)
        # Shrunk to the survivor, then back to 2: end the job a little ahead of both ranks.
        if not last_step and truth.sizes[-2:] == [1, 2]:
            last_step.append(truth.step + 100)
            (tmp_path / "stop.tmp").write_text(str(last_step[0]))
            os.replace(tmp_path / "stop.tmp", stop_file)

    settings = RayExecutor.create_settings(timeout_s=60, discovery_interval_s=0.2)
    with RayExecutor(settings, min_workers=1, max_workers=2, cpus_per_worker=1, elastic_timeout=120) as executor:
        executor.start()
        kwargs = {"crash_dir": str(tmp_path), "stop_file": str(stop_file)}
        results = executor.run(train, args=[5_000], kwargs=kwargs, callbacks=[stop_once_recovered])
    assert not (tmp_path / "crash-1-40").exists(), "the crash never happened"
    assert last_step, f"the job never went 2 -> 1 -> 2 workers: sizes {truth.sizes}"
    assert len(results) == 2
    for result in results:
        assert result["weights"] == pytest.approx(reference(last_step[0]), rel=1e-9, abs=1e-12)


def numpy_on_the_worker() -> bool:
    return importlib.util.find_spec("numpy") is not None


def test_workers_have_no_numpy_either() -> None:
    settings = RayExecutor.create_settings(timeout_s=60)
    with RayExecutor(settings, num_workers=1, cpus_per_worker=0.5) as executor:
        executor.start()
        assert executor.run(numpy_on_the_worker) == [False]


def test_elastic_only_methods_say_so() -> None:
    settings = RayExecutor.create_settings(timeout_s=60)
    with RayExecutor(settings, min_workers=1, max_workers=2) as executor:
        executor.start()
        with pytest.raises(NotImplementedError, match="elastic"):
            executor.execute_single(lambda _: None)


def test_tracking_is_simply_absent(capfd: Any) -> None:
    """No observer is installed: no warning, no error, nothing printed about tracking."""
    settings = RayExecutor.create_settings(timeout_s=60)
    with RayExecutor(settings, num_workers=1, cpus_per_worker=0.5) as executor:
        executor.start()
        assert executor.execute(lambda _: os.getpid() > 0) == [True]
    assert "track" not in capfd.readouterr().err.lower()
