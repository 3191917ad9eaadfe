"""Fault points: named places in the elastic protocol where a test makes a worker crash, freeze or raise.

Production code calls ``fault_point(name, **context)`` at each of them. Unless the environment variable
``ELASTRAIN_FAULTS`` names a JSON file when this module is first imported, ``fault_point`` is a function that
returns at once: arming is decided here, once, and nothing else in the code asks whether it is armed.

The file holds a list of specs::

    [{"point": "sync_mid", "role": "source", "action": "crash", "at": 3, "min_generation": 2,
      "marker": "/tmp/run/fault-1"}]

A spec fires at most once across every process that reads the file: the first process to create ``marker``
(``O_CREAT | O_EXCL``) fires it, after writing one JSON line into it (``point``, ``role``, ``action``,
``worker_id``, ``pid``, ``rank``, ``generation``, ``time``), flushed and fsynced. ``crash`` sends the process
SIGKILL, ``freeze`` SIGSTOP (a process that stopped answering, heartbeat included), ``raise`` raises
:class:`InjectedFault` (the job's own error, not a failed collective: the job fails). A spec matches a pass
through its point when the pass's role is the spec's (or the spec says ``"any"``) and the worker's generation
is at least ``min_generation`` (default 1). At the two ``_mid`` points ``at`` (default 0) counts units done in
the pass's sync or commit: the spec fires at the first matching pass with at least ``at`` units done (so ``at``
0 and 1 both mean after the first). At every other point it counts matching passes in this process: the spec
fires at pass ``at`` (0: the first).

Points, in protocol order, and the roles each sees (``ROLES_AT``):

- ``join``: the worker got its next world (it is a member), before it arrives. Pre-sync roles.
- ``pg_init``: every member arrived, before the process group (its store, then ``init_process_group``) forms.
  Pre-sync roles.
- ``reset_callbacks``: at a reset (generation > 1, or persisted state loaded), before the reset callbacks run.
  Pre-sync roles (the role the worker had when the reset began).
- ``sync_before``: the source is decided (``commit_counts`` answered), before any state moves. Sync roles.
- ``sync_mid``: one pass after each unit of the sync moved (context ``done``: 1, 2, ...): each tensor of the
  model and optimizer handlers, each other handler once its sync returned, then the plain values. Counted on
  every rank: on the source a unit went out, on a receiver it arrived. Sync roles.
- ``sync_after``: every unit moved, before the commit count changes and the received state is committed.
  Sync roles.
- ``commit_copy_mid``: inside ``commit()``, one pass after each handler of a ``TorchState`` copied its part
  into the committed copy (context ``done``: 1, 2, ...), before the rest (the plain values at least). A state
  without handlers passes once, before its values are copied (``done`` 0). Sync roles (kept from the world's
  sync).
- ``persist_handoff``: rank 0 only, in ``commit()`` right before ``persistence.committed(state)``. Rank 0 is the
  sync source or a newcomer, so those are its only roles.
- ``finish``: the user's function returned, before the result is handed back. Sync roles.

Roles:

- ``source``: this rank is the sync source of its world's reset (the lowest rank holding the most commits).
- ``survivor_at_commit``: it held state (commits, or received state once) and its live state is its last
  commit (the reset came from the interrupt ``commit()`` raised, or after a rollback).
- ``survivor_between_commits``: it held state, with work since its last commit (its training code raised
  the interrupt, e.g. from ``check_host_updates()`` between commits).
- ``newcomer``: it never held state: no commits, and never received state (by a sync or from persistence).
- ``any``: matches every role.

Pre-sync roles are the last three; a point before the source is known never sees ``source``. From
``sync_before`` on, a worker's role is the one it has in its world's sync, kept until its next reset (so
``finish`` on a ``newcomer`` means a worker that joined as a newcomer at its world's reset).
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from typing import Any

POINTS = (
    "join",
    "pg_init",
    "reset_callbacks",
    "sync_before",
    "sync_mid",
    "sync_after",
    "commit_copy_mid",
    "persist_handoff",
    "finish",
)
ROLES = ("source", "survivor_at_commit", "survivor_between_commits", "newcomer", "any")
ACTIONS = ("crash", "freeze", "raise")
_PRE_SYNC = ("survivor_at_commit", "survivor_between_commits", "newcomer")
_SYNC = ("source", *_PRE_SYNC)
#: The roles a worker can have at each point (``"any"`` matches at every point).
ROLES_AT: dict[str, tuple[str, ...]] = {
    "join": _PRE_SYNC,
    "pg_init": _PRE_SYNC,
    "reset_callbacks": _PRE_SYNC,
    "sync_before": _SYNC,
    "sync_mid": _SYNC,
    "sync_after": _SYNC,
    "commit_copy_mid": _SYNC,
    # Only rank 0 persists, and at a reset rank 0 is the source (the lowest rank with the most commits, which every
    # survivor holds) or a newcomer (no survivor ranks before it).
    "persist_handoff": ("source", "newcomer"),
    "finish": _SYNC,
}
ENV_VAR = "ELASTRAIN_FAULTS"
_KEYS = {"point", "role", "action", "at", "min_generation", "marker"}


class InjectedFault(RuntimeError):
    """Raised by a fault point whose spec says ``"action": "raise"``."""


class FaultSpecError(ValueError):
    """The fault file cannot be used; the message names the spec and what to change."""


class _Spec:
    def __init__(self, point: str, role: str, action: str, at: int, min_generation: int, marker: str) -> None:
        self.point, self.role, self.action = point, role, action
        self.at, self.min_generation, self.marker = at, min_generation, marker
        self.passes = 0  # matching passes seen in this process
        self.done = False  # fired here, or found fired by another process


def load_specs(path: str) -> list[_Spec]:
    """Read and check a fault file; raises :class:`FaultSpecError` saying what to change."""
    where = f"{ENV_VAR} file {path}"
    try:
        with open(path) as file:
            raw = json.load(file)
    except (OSError, ValueError) as error:
        raise FaultSpecError(f"{where} could not be read as JSON ({error}); point {ENV_VAR} at a JSON list.") from None
    if not isinstance(raw, list):
        raise FaultSpecError(f"{where} holds a {type(raw).__name__}; it must hold a JSON list of specs.")
    return [_check(entry, f"{where}, spec {index}") for index, entry in enumerate(raw)]


def _check(entry: Any, where: str) -> _Spec:
    if not isinstance(entry, dict):
        raise FaultSpecError(f"{where} is a {type(entry).__name__}; make it an object with keys {sorted(_KEYS)}.")
    unknown = sorted(set(entry) - _KEYS)
    if unknown:
        raise FaultSpecError(f"{where} has unknown key(s) {unknown}; the keys are {sorted(_KEYS)}.")
    missing = sorted({"point", "role", "action", "marker"} - set(entry))
    if missing:
        raise FaultSpecError(f"{where} lacks {missing}; add them.")
    point, role, action, marker = entry["point"], entry["role"], entry["action"], entry["marker"]
    if point not in POINTS:
        raise FaultSpecError(f"{where}: point {point!r} is not a fault point; use one of {list(POINTS)}.")
    if role != "any" and role not in ROLES_AT[point]:
        raise FaultSpecError(
            f"{where}: role {role!r} never occurs at {point!r}; use one of {[*ROLES_AT[point], 'any']}."
        )
    if action not in ACTIONS:
        raise FaultSpecError(f"{where}: action {action!r} is unknown; use one of {list(ACTIONS)}.")
    if not isinstance(marker, str) or not marker:
        raise FaultSpecError(f"{where}: marker must be a file path (a non-empty string), got {marker!r}.")
    numbers = {"at": entry.get("at", 0), "min_generation": entry.get("min_generation", 1)}
    for key, value in numbers.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise FaultSpecError(f"{where}: {key} must be a whole number >= 0, got {value!r}.")
    return _Spec(point, role, action, numbers["at"], numbers["min_generation"], marker)


def _where(context: dict[str, Any]) -> dict[str, Any]:
    """The worker's identity and role: from the context where given, else from its elastic runtime."""
    from elastrain.executor._private.elastic.worker import runtime

    job = runtime.current_or_none()
    found: dict[str, Any] = {"worker_id": "", "rank": -1, "generation": 0, "role": "newcomer"}
    if job is not None:
        member = job.member
        found.update(
            worker_id=job.worker_id,
            rank=member.slot.rank if member is not None else -1,
            generation=job.generation,
            role=job.role,
        )
    found.update({key: context[key] for key in found if key in context})
    return found


def _armed_fault_point(name: str, **context: object) -> None:
    specs = [spec for spec in _specs if spec.point == name and not spec.done]
    if not specs:
        return
    where = _where(context)
    for spec in specs:
        if spec.role not in ("any", where["role"]) or where["generation"] < spec.min_generation:
            continue
        if name.endswith("_mid"):
            done = context.get("done", 0)
            if not isinstance(done, int) or done < spec.at:
                continue
        else:
            spec.passes += 1
            if spec.passes <= spec.at:
                continue
        spec.done = True
        if _claim(spec, name, where):
            _act(spec, name, where["role"])


def _claim(spec: _Spec, name: str, where: dict[str, Any]) -> bool:
    """Create the spec's marker; only the process that creates it fires."""
    try:
        fd = os.open(spec.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    line = {"point": name, "role": where["role"], "action": spec.action, "worker_id": where["worker_id"]}
    line.update(pid=os.getpid(), rank=where["rank"], generation=where["generation"], time=time.time())
    with os.fdopen(fd, "w") as file:
        file.write(json.dumps(line) + "\n")
        file.flush()
        os.fsync(file.fileno())  # the record must outlive the SIGKILL that follows
    return True


def _act(spec: _Spec, name: str, role: str) -> None:
    if spec.action == "crash":
        os.kill(os.getpid(), signal.SIGKILL)
    elif spec.action == "freeze":
        # Aimed at this thread: a process-wide SIGSTOP goes to the main thread first, and this one (Ray runs the
        # job on a pool thread) could meanwhile go on into the protocol's next collective.
        signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)
    else:
        raise InjectedFault(f"fault injected at {name!r} on a worker in role {role!r}")


def _unarmed_fault_point(name: str, **context: object) -> None:
    """Pass the fault point ``name``: nothing happens, as no fault file was named when this module was imported."""


_path = os.environ.get(ENV_VAR)
_specs: list[_Spec] = load_specs(_path) if _path else []
fault_point = _armed_fault_point if _path else _unarmed_fault_point
