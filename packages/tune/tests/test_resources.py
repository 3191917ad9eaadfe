"""trial_resources: the placement group factory of a trial, its checks, and a request that can never fit."""

from __future__ import annotations

import re
from typing import Any

import pytest

from elastrain.executor import PlacementError
from elastrain.tune import trial_resources
from elastrain_testutils.ray_testing import local_ray


def test_a_fixed_size_trial_gets_one_bundle_per_worker_and_an_empty_driver() -> None:
    factory = trial_resources(num_workers=3, cpus_per_worker=0.5)
    assert factory.head_bundle_is_empty
    assert factory.bundles == [{"CPU": 0.5}] * 3
    assert factory.strategy == "PACK"


def test_an_elastic_trial_reserves_max_workers_and_its_driver() -> None:
    factory = trial_resources(
        min_workers=1, max_workers=2, cpus_per_worker=1, gpus_per_worker=0.5, driver={"CPU": 0.1}, strategy="SPREAD"
    )
    assert not factory.head_bundle_is_empty
    assert factory.bundles == [{"CPU": 0.1}, {"CPU": 1.0, "GPU": 0.5}, {"CPU": 1.0, "GPU": 0.5}]
    assert factory.strategy == "SPREAD"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "needs num_workers, or min_workers and max_workers"),
        ({"num_workers": 2, "min_workers": 1}, "not both"),
        ({"min_workers": 1}, "An elastic trial needs max_workers"),
        ({"min_workers": 3, "max_workers": 2}, "max_workers=2 is below min_workers=3"),
        ({"num_workers": 0}, "num_workers must be a positive int"),
        ({"num_workers": True}, "num_workers must be a positive int"),
        ({"num_workers": 1, "cpus_per_worker": 0}, "cpus_per_worker must be a positive number"),
        ({"num_workers": 1, "gpus_per_worker": -1}, "gpus_per_worker must be a non-negative number"),
        ({"num_workers": 1, "driver": {"CPU": "one"}}, "driver['CPU'] must be a non-negative number"),
        ({"num_workers": 1, "strategy": "spread"}, "strategy must be one of PACK, SPREAD"),
    ],
)
def test_bad_requests_say_what_to_change(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        trial_resources(**kwargs)


def test_a_request_the_cluster_can_never_hold_fails_before_tune_waits_for_it() -> None:
    with local_ray(num_cpus=2):
        trial_resources(num_workers=2)  # fits
        with pytest.raises(PlacementError) as raised:
            trial_resources(num_workers=3, driver={"CPU": 0.5})
    text = str(raised.value)
    assert "This trial asks for 4 bundles (1 × {CPU: 0.5}, 3 × {CPU: 1}" in text
    assert "2 CPU in total" in text
    assert "Ask for fewer workers" in text
