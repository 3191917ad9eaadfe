"""An elastic job started inside a placement group (a Ray Tune trial's, say) puts its workers into that group's
bundles, and says clearly when the group cannot hold it; check_can_place tells a request that can never fit."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from elastrain.executor import PlacementError, RayExecutor, check_can_place
from elastrain_testutils.ray_testing import local_ray


@pytest.fixture(scope="module", autouse=True)
def ray_3_cpus() -> Iterator[None]:
    with local_ray(num_cpus=3):
        yield


def where_am_i() -> dict[str, Any]:
    import ray
    import torch.distributed as dist

    from elastrain.executor import elastic

    state = elastic.ObjectState(step=0)

    @elastic.run
    def loop(state: elastic.ObjectState) -> dict[str, Any]:
        return {"group": ray.get_runtime_context().get_placement_group_id(), "size": dist.get_world_size()}

    result: dict[str, Any] = loop(state)
    return result


class Driver:
    """Runs an elastic executor from inside the placement group it was scheduled in."""

    def run(self, **executor: Any) -> Any:
        settings = RayExecutor.create_settings(timeout_s=60)
        with RayExecutor(settings, **executor) as ex:
            ex.start()
            return ex.run(where_am_i)

    def start(self, **executor: Any) -> None:
        RayExecutor(RayExecutor.create_settings(), **executor).start()


def _driver_in(bundles: list[dict[str, float]]) -> tuple[Any, Any]:
    import ray
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    group = placement_group(bundles)
    ray.get(group.ready(), timeout=60)
    strategy = PlacementGroupSchedulingStrategy(
        group, placement_group_bundle_index=0, placement_group_capture_child_tasks=True
    )
    return group, ray.remote(Driver).options(num_cpus=0, scheduling_strategy=strategy).remote()


def test_workers_go_into_the_bundles_of_the_group_the_driver_runs_in() -> None:
    import ray
    from ray.util.placement_group import remove_placement_group

    group, driver = _driver_in([{"CPU": 1}, {"CPU": 1}])
    try:
        results = ray.get(driver.run.remote(min_workers=1, max_workers=2), timeout=120)
    finally:
        remove_placement_group(group)
    assert [r["size"] for r in results] == [2, 2]
    assert {r["group"] for r in results} == {group.id.hex()}


@pytest.mark.parametrize(
    ("bundles", "executor", "message"),
    [
        ([{"CPU": 0.5}], {"min_workers": 1}, r"bundles \(\[\{'CPU': 0.5\}\]\) hold no worker of 1 CPU"),
        ([{"CPU": 1}], {"min_workers": 2, "max_workers": 2}, "holds 1 workers, below min_workers=2"),
    ],
)
def test_a_group_that_cannot_hold_the_job_is_refused(
    bundles: list[dict[str, float]], executor: dict[str, Any], message: str
) -> None:
    from ray.util.placement_group import remove_placement_group

    group, driver = _driver_in(bundles)
    try:
        with pytest.raises(PlacementError, match=message):
            _start(driver, executor)
    finally:
        remove_placement_group(group)


def _start(driver: Any, executor: dict[str, Any]) -> None:
    """Start an executor in ``driver`` and raise what it raised there."""
    import ray

    try:
        ray.get(driver.start.remote(**executor), timeout=60)
    except ray.exceptions.RayTaskError as error:
        raise error.cause from None


def test_check_can_place_fits_mixed_bundles_onto_the_nodes() -> None:
    check_can_place([{"CPU": 0.5}, {"CPU": 1}, {"CPU": 1}], "PACK")
    check_can_place([{"CPU": 3}], "STRICT_PACK")
    with pytest.raises(PlacementError) as raised:
        check_can_place([{"CPU": 0.5}, {"CPU": 1}, {"CPU": 1}, {"CPU": 1}], "PACK", what="This trial")
    text = str(raised.value)
    assert "This trial asks for 4 bundles (1 × {CPU: 0.5}, 3 × {CPU: 1}, strategy PACK)" in text
    assert "it has 3 CPU in total (its 1 node), short of CPU" in text
    with pytest.raises(PlacementError, match="short of room on the nodes"):
        check_can_place([{"CPU": 1}, {"CPU": 1}], "STRICT_SPREAD")  # one node
    with pytest.raises(PlacementError, match="short of GPU"):
        check_can_place([{"CPU": 1, "GPU": 1}])
    with pytest.raises(ValueError, match="strategy must be PACK, SPREAD, STRICT_PACK or STRICT_SPREAD"):
        check_can_place([{"CPU": 1}], "pack")
