"""Fault injection for testing training code against the elastic protocol.

A test writes a JSON list of fault specs to a file and starts the job with ``FAULTS_ENV`` naming it, for
example through ``RayExecutor.start(extra_env_vars={FAULTS_ENV: path})``; each worker reads the file when it
first imports the executor's fault module. A spec makes a worker crash (SIGKILL), freeze (SIGSTOP) or raise
:class:`InjectedFault` at one of ``POINTS`` when it has one of the roles ``ROLES_AT`` lists there::

    [{"point": "sync_mid", "role": "source", "action": "crash", "at": 3, "marker": "/tmp/run/fault-1"}]

Each spec fires once across every process that reads the file: the first to create ``marker`` fires it, after
writing one JSON line into it (point, role, action, worker, pid, rank, generation, time). With ``FAULTS_ENV``
unset every fault point is a function that returns at once. A bad file raises :class:`FaultSpecError` naming the
spec and what to change. docs/elastic.md lists what each point and role means.
"""

from elastrain.executor._private.elastic.worker.faults import (
    ACTIONS,
    POINTS,
    ROLES,
    ROLES_AT,
    FaultSpecError,
    InjectedFault,
)
from elastrain.executor._private.elastic.worker.faults import ENV_VAR as FAULTS_ENV

__all__ = ["ACTIONS", "FAULTS_ENV", "POINTS", "ROLES", "ROLES_AT", "FaultSpecError", "InjectedFault"]
