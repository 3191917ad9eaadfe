"""Each tracker's client comes with an extra of elastrain-trackers, imported only when that tracker is used."""

from __future__ import annotations

import importlib
from types import ModuleType


def require(module: str, extra: str, tracker: str) -> ModuleType:
    """``module``, or an ImportError that says which extra brings it."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise ImportError(
            f"The {tracker} tracker needs {module.split('.')[0]}: pip install 'elastrain-trackers[{extra}]'"
        ) from error
