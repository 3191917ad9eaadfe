"""The state actor's options: defaults, and checks that say what to change."""

from __future__ import annotations

import math
import os
from typing import Any

DEFAULT_MAX_RUNS = 10_000
# The newest runs keep their history (metrics, events, departed workers): about 80 KB each as JSON with 4 metrics
# at its full 1,000 points, 250 KB at most (32 metrics), so 40 MB typically and 125 MB at most.
DEFAULT_MAX_HISTORIES = 500
DEFAULT_SNAPSHOT_INTERVAL_S = 5.0
# The deadline of each snapshot read, write, listing or deletion.
DEFAULT_IO_TIMEOUT_S = 60.0
# How often the actor looks for runs whose driver is gone.
DEFAULT_DRIVER_CHECK_INTERVAL_S = 10.0

# Environment: where the actor snapshots. A folder or fsspec URI; "default" for the embedded default, "off" for
# no persistence.
SNAPSHOT_URI_ENV = "ELASTRAIN_STATE_SNAPSHOT_URI"


def check_max_runs(max_runs: Any, name: str = "max_runs") -> int:
    if isinstance(max_runs, bool) or not isinstance(max_runs, int) or max_runs < 1:
        raise ValueError(f"{name} must be a positive int, got {max_runs!r}.")
    return max_runs


def check_seconds(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive, finite number of seconds, got {value!r}.")
    return float(value)


def check_snapshot_uri(uri: Any, source: str = "snapshot_uri") -> str:
    """A local folder (absolute, ``~`` expanded, or ``file://``) or a URI of a filesystem fsspec knows."""
    if not isinstance(uri, str) or not uri.strip():
        raise ValueError(f"{source} must be a folder or an fsspec URI (e.g. s3://bucket/state), got {uri!r}.")
    if "://" not in uri:
        path = os.path.expanduser(uri)
        if not os.path.isabs(path):
            raise ValueError(
                f"{source} {uri!r} is a relative path; the state actor runs in another process and folder: give an "
                "absolute folder (on the head node) or an fsspec URI."
            )
        return path
    protocol = uri.split("://", 1)[0]
    import fsspec

    try:
        fsspec.get_filesystem_class(protocol)
    except ValueError:
        raise ValueError(
            f"{source} {uri!r} names the unknown filesystem {protocol!r}; use a local folder or an fsspec URI "
            "(file://, s3://, gs://, ...)."
        ) from None
    except ImportError as error:
        raise ValueError(f"{source} {uri!r} needs a package that is not installed: {error}") from None
    return uri


def resolve_persistence(snapshot_uri: Any, persist: Any) -> tuple[str | None, bool]:
    """(URI, persist) from the arguments and the environment: a URI to use, or None with persist telling whether
    the actor uses its embedded default folder."""
    if persist is not None and not isinstance(persist, bool):
        raise ValueError(f"persist must be True, False or None, got {persist!r}.")
    if snapshot_uri is not None:
        if persist is False:
            raise ValueError("snapshot_uri was given with persist=False: drop one of them.")
        return check_snapshot_uri(snapshot_uri), True
    if persist is False:
        return None, False
    environment = os.environ.get(SNAPSHOT_URI_ENV, "").strip()
    if environment in ("", "default"):
        return None, True
    if environment == "off":
        return None, bool(persist)  # the argument, when given, wins over the environment
    return check_snapshot_uri(environment, SNAPSHOT_URI_ENV), True
