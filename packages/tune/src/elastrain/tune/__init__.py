"""Ray Tune trials on elastrain: elastic executor jobs as trials that survive node loss, and durable trials.

Driver side: :func:`executor_trainable`, :func:`trial_resources`, :class:`DurableTrainable`,
:func:`trial_store`. Worker side: :func:`trial_persistence`. Names load on first use, so a worker that only
needs :func:`trial_persistence` does not import Ray Tune.
"""

import importlib
from typing import TYPE_CHECKING, Any

from elastrain.tune._private.errors import (
    StorageUnreachableError,
    StoreInUseError,
    TrialIdReusedError,
    TuneIntegrationError,
)
from elastrain.tune._private.worker_side import trial_persistence
from elastrain.tune._version import __version__

if TYPE_CHECKING:
    from elastrain.tune._private.durable_trial import DurableTrainable, trial_store
    from elastrain.tune._private.executor_trial import executor_trainable
    from elastrain.tune._private.resources import trial_resources

_LAZY = {
    "DurableTrainable": "elastrain.tune._private.durable_trial",
    "trial_store": "elastrain.tune._private.durable_trial",
    "executor_trainable": "elastrain.tune._private.executor_trial",
    "trial_resources": "elastrain.tune._private.resources",
}

# Tracebacks and reprs name a class by its __module__: the public module, not where it is implemented.
for _public in (TuneIntegrationError, StoreInUseError, TrialIdReusedError, StorageUnreachableError):
    _public.__module__ = __name__
del _public


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'elastrain.tune' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    # executor jobs as trials
    "executor_trainable",
    "trial_resources",
    "trial_persistence",
    # durable trials
    "trial_store",
    "DurableTrainable",
    # errors
    "TuneIntegrationError",
    "StoreInUseError",
    "TrialIdReusedError",
    "StorageUnreachableError",
    "__version__",
]
