"""The two state machines of an elastic job's driver: the job's phase and each worker's lifecycle.

Each is an enum with one table of legal transitions, and every change of phase goes through :func:`move`. An
illegal transition is a bug in the driver: it raises :class:`IllegalTransition` where the driver runs strictly
(tests set ``ELASTRAIN_STRICT_PROTOCOL=1``) and is logged, then carried out, in production, where stopping a
training job over a bookkeeping slip would cost more than it saves. docs/architecture.md draws both tables; a test
keeps the drawing equal to them.
"""

from __future__ import annotations

import enum
import logging
import os
from collections.abc import Mapping
from typing import TypeVar

logger = logging.getLogger("elastrain.executor")

STRICT_ENV = "ELASTRAIN_STRICT_PROTOCOL"


class JobPhase(enum.Enum):
    STARTING = "starting"  # no group published yet
    FORMING = "forming"  # a group was published to grow or shrink the job; its members come at their next commit
    RECOVERING = "recovering"  # a group was published after a failure; its members must come promptly
    RUNNING = "running"  # every member of the current group arrived
    WAITING = "waiting"  # the current group failed and too few workers are ready to form the next one
    FINISHING = "finishing"  # a worker finished: nothing new starts; the call ends once its group has finished
    FINISHED = "finished"
    FAILED = "failed"


class WorkerPhase(enum.Enum):
    SPARE = "spare"  # asked for without a host, for Ray to place the moment a node with room appears
    STARTING = "starting"  # its actor starts and imports torch
    READY = "ready"  # runs the job's function and waits to be published into a group (a held member waits again)
    MEMBER = "member"  # in a published group: it holds (or is about to receive) the committed state
    LEAVING = "leaving"  # its host went away gracefully: left out of the next group, it stops at its next commit
    STOPPING = "stopping"  # the driver killed it; its call has not ended yet
    GONE = "gone"  # its call ended; the driver no longer tracks it


_J = JobPhase
JOB_TRANSITIONS: Mapping[JobPhase, frozenset[JobPhase]] = {
    _J.STARTING: frozenset({_J.FORMING, _J.RECOVERING, _J.FINISHING, _J.FAILED}),
    _J.FORMING: frozenset({_J.RUNNING, _J.FORMING, _J.RECOVERING, _J.WAITING, _J.FINISHING, _J.FAILED}),
    _J.RECOVERING: frozenset({_J.RUNNING, _J.RECOVERING, _J.WAITING, _J.FINISHING, _J.FAILED}),
    _J.RUNNING: frozenset({_J.FORMING, _J.RECOVERING, _J.WAITING, _J.FINISHING, _J.FAILED}),
    _J.WAITING: frozenset({_J.RECOVERING, _J.FINISHING, _J.FAILED}),
    _J.FINISHING: frozenset({_J.FINISHED, _J.FAILED}),
    _J.FINISHED: frozenset(),
    _J.FAILED: frozenset(),
}

_W = WorkerPhase
WORKER_TRANSITIONS: Mapping[WorkerPhase, frozenset[WorkerPhase]] = {
    _W.SPARE: frozenset({_W.STARTING, _W.STOPPING, _W.GONE}),
    _W.STARTING: frozenset({_W.READY, _W.STOPPING, _W.GONE}),
    _W.READY: frozenset({_W.MEMBER, _W.STOPPING, _W.GONE}),
    _W.MEMBER: frozenset({_W.READY, _W.LEAVING, _W.STOPPING, _W.GONE}),
    _W.LEAVING: frozenset({_W.STOPPING, _W.GONE}),
    _W.STOPPING: frozenset({_W.GONE}),
    _W.GONE: frozenset(),
}

# Workers in these phases count towards the job's size (slots, max_workers, min_workers).
COUNTED = frozenset({_W.STARTING, _W.READY, _W.MEMBER})
# Workers in these phases hold a slot on their host (a leaving one until it has gone).
HOLDING = frozenset({_W.STARTING, _W.READY, _W.MEMBER, _W.LEAVING})
TERMINAL = frozenset({_J.FINISHED, _J.FAILED})


class IllegalTransition(RuntimeError):
    """The driver tried a phase change its tables do not allow (a bug in the driver)."""


def strict_from_environment() -> bool:
    return os.environ.get(STRICT_ENV) == "1"


_P = TypeVar("_P", JobPhase, WorkerPhase)


def move(current: _P, new: _P, *, what: str, strict: bool) -> _P:
    """``new`` if the table allows ``current → new``; otherwise raise (strict) or log, and still return ``new``."""
    table: Mapping[_P, frozenset[_P]] = JOB_TRANSITIONS if isinstance(current, JobPhase) else WORKER_TRANSITIONS
    if new not in table[current]:
        message = f"Illegal transition of {what}: {current.value} → {new.value}."
        if strict:
            raise IllegalTransition(message)
        logger.error("%s Going on; please report this as a bug.", message)
    return new
