"""The horovod backend with a real Horovod build: ``hvd.init()`` and collectives work as under Horovod."""

from __future__ import annotations

import pytest

from elastrain.executor import RayExecutor, context

pytestmark = pytest.mark.usefixtures("ray_4_cpus")


def allreduce_with_horovod() -> tuple[int, int, int, float]:
    import horovod.torch as hvd
    import torch

    hvd.init()
    total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum)
    return hvd.rank(), hvd.size(), hvd.local_rank(), float(total.item())


@pytest.mark.parametrize("nics", [None, {"lo"}])
def test_two_workers_allreduce(nics: set[str] | None) -> None:
    settings = RayExecutor.create_settings(timeout_s=60, nics=nics)
    with RayExecutor(settings, num_workers=2, cpus_per_worker=0.5, backend="horovod") as ex:
        ex.start()
        assert ex.run(allreduce_with_horovod) == [(0, 2, 0, 3.0), (1, 2, 1, 3.0)]


def test_horovod_ranks_match_the_executor_context() -> None:
    def ranks() -> tuple[int, int]:
        import horovod.torch as hvd

        hvd.init()
        return hvd.rank(), context().rank

    settings = RayExecutor.create_settings(timeout_s=60)
    with RayExecutor(settings, num_workers=2, cpus_per_worker=0.5, backend="horovod") as ex:
        ex.start()
        assert ex.run(ranks) == [(0, 0), (1, 1)]
