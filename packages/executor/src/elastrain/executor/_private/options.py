"""The executor's constructor arguments, checked once; every error says what to change."""

from __future__ import annotations

from dataclasses import dataclass

from elastrain.executor._private.settings import ExecutorSettings
from elastrain.executor._private.validation import check_positive


@dataclass(frozen=True)
class ExecutorOptions:
    num_workers: int  # static: the group size; elastic: min_workers
    num_hosts: int | None
    num_workers_per_host: int
    cpus_per_worker: float
    use_gpu: bool
    gpus_per_worker: float  # 0 without GPUs
    use_current_placement_group: bool
    elastic: bool
    min_workers: int | None
    max_workers: int | None
    reset_limit: int | None
    cooldown_range: tuple[float, float] | None
    elastic_timeout: float
    override_discovery: bool
    size_multiple: int = 1  # elastic: every group's size is a multiple of it


def check_options(
    *,
    settings: object,
    num_workers: int | None,
    num_hosts: int | None,
    num_workers_per_host: int,
    cpus_per_worker: float,
    use_gpu: bool,
    gpus_per_worker: float | None,
    use_current_placement_group: bool,
    min_workers: int | None,
    max_workers: int | None,
    reset_limit: int | None,
    cooldown_range: tuple[float, float] | None,
    elastic_timeout: float,
    override_discovery: bool,
    size_multiple: int = 1,
) -> ExecutorOptions:
    if not isinstance(settings, ExecutorSettings):
        raise ValueError(f"settings must come from RayExecutor.create_settings(...), got {type(settings).__name__}.")
    if min_workers is not None and num_workers is not None:
        raise ValueError("Both `min_workers` and `num_workers` provided.")
    if max_workers is not None and (min_workers is None or isinstance(min_workers, bool) or min_workers <= 0):
        raise ValueError("`max_workers` needs a positive `min_workers`: pass min_workers=N for an elastic job.")
    elastic = min_workers is not None
    check_positive("size_multiple", size_multiple, integer=True)
    if min_workers is not None:
        if num_hosts is not None:
            raise ValueError("`num_hosts` is for static jobs; an elastic job takes `min_workers`/`max_workers`.")
        check_positive("min_workers", min_workers, integer=True)
        size = min_workers
        if max_workers is not None:
            check_positive("max_workers", max_workers, integer=True)
            if max_workers < min_workers:
                raise ValueError(f"max_workers={max_workers} is below min_workers={min_workers}.")
        if reset_limit is not None:
            check_positive("reset_limit", reset_limit, integer=True)
        check_positive("elastic_timeout", elastic_timeout)
        _check_size_multiple(size_multiple, min_workers, max_workers)
        if cooldown_range is not None:
            lo_hi = tuple(cooldown_range)
            if len(lo_hi) != 2 or lo_hi[0] > lo_hi[1]:
                raise ValueError(f"cooldown_range must be (lo, hi) seconds with lo <= hi, got {cooldown_range!r}.")
    elif size_multiple != 1:
        raise ValueError(
            f"size_multiple={size_multiple!r} is for elastic jobs (min_workers/max_workers); a static job's size is "
            "fixed: drop size_multiple."
        )
    elif num_workers is not None:
        if num_hosts is not None:
            raise ValueError("Pass either `num_workers`, or `num_hosts` with `num_workers_per_host`, not both.")
        check_positive("num_workers", num_workers, integer=True)
        size = num_workers
    elif num_hosts is not None:
        check_positive("num_hosts", num_hosts, integer=True)
        check_positive("num_workers_per_host", num_workers_per_host, integer=True)
        size = num_hosts * num_workers_per_host
    else:
        raise ValueError(
            "Say how many workers to run: num_workers=N, or num_hosts=H with num_workers_per_host=W, or "
            "min_workers=N for an elastic job."
        )
    check_positive("cpus_per_worker", cpus_per_worker)
    if not isinstance(use_gpu, bool):
        raise ValueError(f"use_gpu must be True or False, got {use_gpu!r}.")
    if gpus_per_worker is not None:
        if not use_gpu:
            raise ValueError("gpus_per_worker is only used with use_gpu=True; pass use_gpu=True or drop it.")
        check_positive("gpus_per_worker", gpus_per_worker)
    gpus = (gpus_per_worker if gpus_per_worker is not None else 1) if use_gpu else 0
    return ExecutorOptions(
        num_workers=size,
        num_hosts=num_hosts if not elastic else None,
        num_workers_per_host=num_workers_per_host,
        cpus_per_worker=cpus_per_worker,
        use_gpu=use_gpu,
        gpus_per_worker=gpus,
        use_current_placement_group=bool(use_current_placement_group),
        elastic=elastic,
        min_workers=min_workers,
        max_workers=max_workers,
        reset_limit=reset_limit,
        cooldown_range=cooldown_range,
        elastic_timeout=elastic_timeout,
        override_discovery=bool(override_discovery),
        size_multiple=size_multiple,
    )


def _check_size_multiple(size_multiple: int, min_workers: int, max_workers: int | None) -> None:
    for name, value in (("min_workers", min_workers), ("max_workers", max_workers)):
        if value is not None and value % size_multiple:
            lower = value // size_multiple * size_multiple
            choices = f"{lower} or {lower + size_multiple}" if lower else f"{size_multiple}"
            raise ValueError(
                f"{name}={value} is not a multiple of size_multiple={size_multiple}: every group has a whole "
                f"multiple of {size_multiple} workers, so use {name}={choices}."
            )
