"""The resource request of a trial whose workers run in its placement group."""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from typing import Any

_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")


def trial_resources(
    *,
    num_workers: int | None = None,
    min_workers: int | None = None,
    max_workers: int | None = None,
    cpus_per_worker: float = 1,
    gpus_per_worker: float = 0,
    driver: Mapping[str, float] | None = None,
    strategy: str = "PACK",
) -> Any:
    """A ``tune.PlacementGroupFactory`` for a trial that runs ``num_workers`` workers, or an elastic job of
    ``min_workers``..``max_workers``.

    The first bundle is the trial's own process (``driver``; by default it takes no resources and shares the
    node of the first worker bundle), then one bundle per worker. An elastic trial reserves ``max_workers``
    worker bundles: Tune starts it when all of them fit, and when a node is lost it goes on with at least
    ``min_workers`` while Ray places the lost bundles again, growing back as soon as they are. ``strategy``
    is the placement group's (``"SPREAD"`` keeps one node's loss from taking several workers). When Ray is
    already initialized, a request the cluster can never hold fails here.
    """
    size = _worker_count(num_workers, min_workers, max_workers)
    worker = {"CPU": _amount("cpus_per_worker", cpus_per_worker, positive=True)}
    if _amount("gpus_per_worker", gpus_per_worker, positive=False):
        worker["GPU"] = float(gpus_per_worker)
    head = {name: _amount(f"driver[{name!r}]", amount, positive=False) for name, amount in (driver or {}).items()}
    if strategy not in _STRATEGIES:
        raise ValueError(f"strategy must be one of {', '.join(_STRATEGIES)}, got {strategy!r}.")
    bundles = [head] + [dict(worker) for _ in range(size)]
    check_fits(bundles, strategy)
    from ray import tune

    return tune.PlacementGroupFactory(bundles, strategy=strategy)


def check_fits(bundles: list[dict[str, float]], strategy: str) -> None:
    """Fail now, with what to change, when Ray is up and its cluster can never hold these bundles (Tune would
    otherwise keep the trial pending for ever)."""
    import ray

    if not ray.is_initialized():
        return
    from elastrain.executor import check_can_place

    check_can_place([b for b in bundles if any(b.values())], strategy, what="This trial")


def _worker_count(num_workers: int | None, min_workers: int | None, max_workers: int | None) -> int:
    if num_workers is not None:
        if min_workers is not None or max_workers is not None:
            raise ValueError(
                "Pass num_workers for a fixed-size trial, or min_workers and max_workers for an elastic one, not both."
            )
        return _count("num_workers", num_workers)
    if min_workers is None:
        raise ValueError("trial_resources needs num_workers, or min_workers and max_workers for an elastic trial.")
    low = _count("min_workers", min_workers)
    if max_workers is None:
        raise ValueError(
            "An elastic trial needs max_workers: its placement group reserves that many worker bundles "
            "(pass max_workers=min_workers for a trial that only shrinks and grows back)."
        )
    high = _count("max_workers", max_workers)
    if high < low:
        raise ValueError(f"max_workers={high} is below min_workers={low}.")
    return high


def _count(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}.")
    return value


def _amount(name: str, value: object, *, positive: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or value < 0 or (positive and value == 0):
        raise ValueError(f"{name} must be a {'positive' if positive else 'non-negative'} number, got {value!r}.")
    return float(value)
