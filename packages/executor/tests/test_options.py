"""Constructor and settings checks: no Ray needed, every error says what to change."""

from __future__ import annotations

import importlib.util

import pytest

from elastrain.executor import Backend, ExecutorSettings, RayExecutor


def settings() -> ExecutorSettings:
    return RayExecutor.create_settings(timeout_s=30)


def test_create_settings_defaults_and_compat_keywords() -> None:
    made = RayExecutor.create_settings(timeout_s=5, ssh_identity_file="~/.ssh/id", nics={"lo"})
    assert made.timeout_s == 5
    assert made.placement_group_timeout_s == 100
    assert made.nics == frozenset({"lo"})


def test_create_settings_unknown_keyword_suggests_the_right_one() -> None:
    with pytest.raises(TypeError, match=r"unknown keyword\(s\) 'timeout' \(did you mean 'timeout_s'\?\)"):
        RayExecutor.create_settings(timeout=5)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"timeout_s": 0}, "timeout_s must be a positive number"),
        ({"placement_group_timeout_s": -1}, "placement_group_timeout_s must be a positive number"),
        ({"nics": "eth0"}, r"nics must be a set of interface names such as \{'eth0'\}, not a string"),
        ({"nics": set()}, "nics must be a non-empty set"),
    ],
)
def test_bad_settings(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RayExecutor.create_settings(**kwargs)  # type: ignore[arg-type]


def test_both_min_workers_and_num_workers() -> None:
    with pytest.raises(ValueError, match=r"^Both `min_workers` and `num_workers` provided\.$"):
        RayExecutor(settings(), num_workers=2, min_workers=1)


@pytest.mark.parametrize("min_workers", [None, 0, -1])
def test_max_workers_needs_positive_min_workers(min_workers: int | None) -> None:
    with pytest.raises(ValueError, match="`max_workers` needs a positive `min_workers`"):
        RayExecutor(settings(), min_workers=min_workers, max_workers=4)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "Say how many workers to run: num_workers=N"),
        ({"num_workers": 0}, "num_workers must be a positive integer"),
        ({"num_workers": 2, "num_hosts": 2}, "either `num_workers`, or `num_hosts`"),
        ({"num_hosts": 2, "num_workers_per_host": 0}, "num_workers_per_host must be a positive integer"),
        ({"num_workers": 2, "cpus_per_worker": 0}, "cpus_per_worker must be a positive number"),
        ({"num_workers": 2, "gpus_per_worker": 1}, "gpus_per_worker is only used with use_gpu=True"),
        ({"num_workers": 2, "use_gpu": True, "gpus_per_worker": -1}, "gpus_per_worker must be a positive"),
        ({"min_workers": 4, "max_workers": 2}, "max_workers=2 is below min_workers=4"),
        ({"min_workers": 1, "reset_limit": 0}, "reset_limit must be a positive integer"),
        ({"min_workers": 1, "cooldown_range": (5, 1)}, r"cooldown_range must be \(lo, hi\)"),
        ({"min_workers": 1, "num_hosts": 2}, "`num_hosts` is for static jobs"),
        ({"num_workers": 2, "backend": "mpi"}, r"Unknown backend 'mpi'; use one of \['horovod', 'torch'\]"),
        ({"min_workers": 2, "size_multiple": 0}, "size_multiple must be a positive integer"),
        ({"min_workers": 3, "max_workers": 4, "size_multiple": 2}, "use min_workers=2 or 4"),
        ({"min_workers": 2, "max_workers": 5, "size_multiple": 2}, "max_workers=5 is not a multiple of size_multiple"),
        ({"min_workers": 1, "size_multiple": 2}, "min_workers=1 is not a multiple .* use min_workers=2"),
        ({"num_workers": 4, "size_multiple": 2}, "size_multiple=2 is for elastic jobs"),
        ({"num_workers": 4, "size_multiple": True}, "size_multiple must be a positive integer"),
    ],
)
def test_bad_constructor_arguments(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RayExecutor(settings(), **kwargs)  # type: ignore[arg-type]


def test_settings_must_come_from_create_settings() -> None:
    with pytest.raises(ValueError, match=r"settings must come from RayExecutor\.create_settings"):
        RayExecutor({"timeout_s": 5}, num_workers=1)  # type: ignore[arg-type]


def test_elastic_keywords_are_accepted() -> None:
    executor = RayExecutor(settings(), min_workers=1, max_workers=3, reset_limit=2, cooldown_range=(1, 10))
    assert executor.options.elastic
    assert executor.num_workers == 1


def test_size_multiple_reaches_the_options() -> None:
    executor = RayExecutor(settings(), min_workers=2, max_workers=6, size_multiple=2)
    assert executor.options.size_multiple == 2


def test_num_hosts_sets_the_size() -> None:
    assert RayExecutor(settings(), num_hosts=3, num_workers_per_host=2).num_workers == 6


def test_horovod_backend_without_horovod_names_the_extra() -> None:
    if importlib.util.find_spec("horovod") is None:
        with pytest.raises(ImportError, match=r"pip install 'elastrain-executor\[horovod\]'"):
            RayExecutor(settings(), num_workers=2, backend="horovod")
    else:  # the horovod session: the backend builds
        assert RayExecutor(settings(), num_workers=2, backend="horovod").backend.name == "horovod"


def test_custom_backend_instance() -> None:
    class Quiet(Backend):
        name = "quiet"

        def worker_env(self, placements, group, settings, run_id):  # type: ignore[no-untyped-def]
            return [{} for _ in placements]

    assert RayExecutor(settings(), num_workers=1, backend=Quiet()).backend.name == "quiet"


@pytest.mark.parametrize(
    ("method", "args"), [("run_remote", (print,)), ("execute_single", (print,)), ("execute", (print,))]
)
def test_elastic_jobs_have_no_per_worker_calls(method: str, args: tuple[object, ...]) -> None:
    executor = RayExecutor(settings(), min_workers=1)
    with pytest.raises(NotImplementedError, match=rf"{method}\(\) is not available for elastic jobs"):
        getattr(executor, method)(*args)
