"""Placement across the nodes of a real ray.cluster_utils.Cluster, with fake GPU resources."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from elastrain.executor import RayExecutor, context
from elastrain_testutils.ray_testing import local_cluster

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    # Two nodes, each with 2 CPUs and 2 GPUs (Ray resources only: CUDA is never touched).
    with local_cluster({"num_cpus": 2, "num_gpus": 2}, {"num_cpus": 2, "num_gpus": 2}) as cluster:
        yield cluster


def describe() -> dict[str, Any]:
    return {"ctx": context(), "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"), "group": os.environ["GROUP_RANK"]}


def test_workers_per_host_get_local_and_cross_ranks(cluster: Any) -> None:
    settings = RayExecutor.create_settings(timeout_s=60, placement_group_timeout_s=30)
    with RayExecutor(settings, num_hosts=2, num_workers_per_host=2, cpus_per_worker=0.5) as ex:
        ex.start()
        seen = [result["ctx"] for result in ex.run(describe)]
    assert [c.rank for c in seen] == [0, 1, 2, 3]
    assert [c.local_rank for c in seen] == [0, 1, 0, 1]
    assert [c.cross_rank for c in seen] == [0, 0, 1, 1]
    assert {c.cross_size for c in seen} == {2}
    assert [c.node_rank for c in seen] == [0, 0, 1, 1]
    assert seen[0].node_id == seen[1].node_id != seen[2].node_id == seen[3].node_id
    assert {c.node_id for c in seen} == {node.node_id for node in cluster.list_all_nodes()}


def test_gpu_workers_see_every_gpu_of_their_host(cluster: Any) -> None:
    settings = RayExecutor.create_settings(timeout_s=60, placement_group_timeout_s=30)
    with RayExecutor(settings, num_hosts=2, num_workers_per_host=2, cpus_per_worker=0.5, use_gpu=True) as ex:
        ex.start()
        results = ex.run(describe)
    for result in results:
        ctx = result["ctx"]
        assert len(ctx.gpu_ids) == 1
        assert sorted(ctx.visible_gpu_ids) == ["0", "1"]
        assert result["cuda"] == ",".join(ctx.visible_gpu_ids)
    for node_rank in (0, 1):
        on_node = [r["ctx"] for r in results if r["ctx"].node_rank == node_rank]
        assert sorted(c.device_index for c in on_node) == [0, 1]


def test_packed_workers_fill_nodes(cluster: Any) -> None:
    settings = RayExecutor.create_settings(timeout_s=60, placement_group_timeout_s=30)
    with RayExecutor(settings, num_workers=4, cpus_per_worker=1) as ex:
        ex.start()
        seen = [result["ctx"] for result in ex.run(describe)]
    assert [c.local_rank for c in seen] == [0, 1, 0, 1]
    assert [c.node_rank for c in seen] == [0, 0, 1, 1]
    assert len({c.node_id for c in seen}) == 2


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        # 3.6 CPU in all fit the cluster's 4, but each 2-CPU node holds one 1.2-CPU worker
        ({"num_workers": 3, "cpus_per_worker": 1.2}, r"4 CPU in total \(its 2 nodes\), room for 2 .* num_workers=2"),
        ({"num_hosts": 3, "num_workers_per_host": 1}, r"only 2 of its nodes have .* num_hosts=2 or fewer"),
    ],
)
def test_a_request_no_set_of_nodes_can_hold_fails_at_once(cluster: Any, kwargs: dict[str, Any], message: str) -> None:
    from elastrain.executor import PlacementError

    settings = RayExecutor.create_settings(timeout_s=60, placement_group_timeout_s=60)
    with RayExecutor(settings, **kwargs) as ex, pytest.raises(PlacementError, match=message):
        ex.start()
