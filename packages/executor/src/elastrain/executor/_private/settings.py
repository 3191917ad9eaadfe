"""Executor settings: what ``RayExecutor.create_settings`` returns."""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from elastrain.executor._private.validation import check_positive

# Below this, a heartbeat delayed by a loaded machine (a few beats late) would read as a frozen worker.
_MIN_LIVENESS_TIMEOUT_S = 1.0


@dataclass
class ExecutorSettings:
    """Timeouts and network choices for an executor.

    ``timeout_s``: how long start-up steps may take (actors answering, the backend's rendezvous).
    ``placement_group_timeout_s``: how long to wait for the cluster to grant the workers' resources.
    ``nics``: network interfaces the collective backend may use (e.g. ``{"eth0"}``); ``None`` lets the backend
    choose.

    Elastic jobs: ``discovery`` is the ``HostDiscovery`` used with ``override_discovery=False`` (settable
    afterwards, as with Horovod's ``settings.discovery = ...``), polled every ``discovery_interval_s``.
    ``liveness_timeout_s``: a worker whose heartbeat (a thread in its process, independent of the training
    code and of collectives) has been silent this long is evicted: killed, which fails its peers' collectives at
    once, and replaced. ``collective_timeout_s`` bounds a collective whose peer is alive but stuck (a hung data
    loader or NCCL call); set it above the longest phase in which some workers wait in a collective for
    others (a rank-0-only evaluation or checkpoint). Members of a group formed after a failure that have not
    arrived within it are evicted too. ``spare_worker``: with Ray's own
    discovery and ``max_workers`` set, while the job is below ``max_workers`` and every known slot is taken, keep
    one worker request pending for Ray to place on the next node with room (a node that joins then gets a
    worker before discovery's next poll; like Ray Train's elastic mode, the pending request also tells an
    autoscaler that the job could use one more worker).

    ``start_over_on_state_loss``: when every worker that held the committed state died (say the last survivor
    of a crash dies while it syncs its replacement) and nothing persisted it, an elastic job fails with
    ``ElasticJobError``, as going on would silently train from the initial state. Set it to True to have the
    workers start over from their initial state instead (they log a warning and the run records a
    ``state_lost_start_over`` event). Persisting the state (``state.persist_with(...)``) resumes from the latest
    copy either way.

    ``ssh_identity_file`` and ``ssh_str`` exist for compatibility with Horovod's settings and are unused: Ray
    starts the workers, not ssh.
    """

    timeout_s: float = 30
    placement_group_timeout_s: float = 100
    nics: frozenset[str] | None = None
    ssh_identity_file: str | None = None
    ssh_str: str | None = None
    verbose: int = 1
    discovery: Any = None
    discovery_interval_s: float = 1.0
    collective_timeout_s: float = 600.0
    spare_worker: bool = True
    liveness_timeout_s: float = 8.0
    start_over_on_state_loss: bool = False


def create_settings(
    timeout_s: float = 30,
    ssh_identity_file: str | None = None,
    ssh_str: str | None = None,
    placement_group_timeout_s: float = 100,
    nics: Iterable[str] | None = None,
    verbose: int = 1,
    discovery: Any = None,
    discovery_interval_s: float = 1.0,
    collective_timeout_s: float = 600.0,
    spare_worker: bool = True,
    liveness_timeout_s: float = 8.0,
    start_over_on_state_loss: bool = False,
    **unknown: object,
) -> ExecutorSettings:
    if unknown:
        raise TypeError(_unknown_keywords_message("create_settings", unknown, SETTINGS_KEYWORDS))
    check_positive("timeout_s", timeout_s)
    check_positive("placement_group_timeout_s", placement_group_timeout_s)
    check_positive("discovery_interval_s", discovery_interval_s)
    check_positive("collective_timeout_s", collective_timeout_s)
    check_positive("liveness_timeout_s", liveness_timeout_s)
    if liveness_timeout_s < _MIN_LIVENESS_TIMEOUT_S:
        raise ValueError(
            f"liveness_timeout_s={liveness_timeout_s} is too short to tell a busy worker from a frozen one; "
            f"use at least {_MIN_LIVENESS_TIMEOUT_S:g} s."
        )
    if not isinstance(spare_worker, bool):
        raise ValueError(f"spare_worker must be True or False, got {spare_worker!r}.")
    if not isinstance(start_over_on_state_loss, bool):
        raise ValueError(f"start_over_on_state_loss must be True or False, got {start_over_on_state_loss!r}.")
    if isinstance(nics, str):
        raise ValueError(f"nics must be a set of interface names such as {{{nics!r}}}, not a string.")
    nic_set = None if nics is None else frozenset(nics)
    if nic_set is not None and (not nic_set or not all(isinstance(n, str) and n for n in nic_set)):
        raise ValueError(f"nics must be a non-empty set of interface names such as {{'eth0'}}, got {nics!r}.")
    return ExecutorSettings(
        timeout_s=timeout_s,
        placement_group_timeout_s=placement_group_timeout_s,
        nics=nic_set,
        ssh_identity_file=ssh_identity_file,
        ssh_str=ssh_str,
        verbose=verbose,
        discovery=discovery,
        discovery_interval_s=discovery_interval_s,
        collective_timeout_s=collective_timeout_s,
        spare_worker=spare_worker,
        liveness_timeout_s=liveness_timeout_s,
        start_over_on_state_loss=start_over_on_state_loss,
    )


def _unknown_keywords_message(function: str, unknown: dict[str, object], known: Iterable[str]) -> str:
    known = list(known)
    hints = []
    for name in unknown:
        close = difflib.get_close_matches(name, known, n=1)
        hints.append(f"{name!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    return f"{function}() got unknown keyword(s) {', '.join(hints)}; it accepts {', '.join(known)}."


SETTINGS_KEYWORDS = tuple(p for p in inspect.signature(create_settings).parameters if p != "unknown")
