"""Runs whose driver is gone: found by the state actor and ended as ABORTED, so that retention can drop them.

A run that is not over is abandoned when any of these holds, asked of Ray's GCS:
- its controller actor (the executor's message actor, which lives exactly as long as the executor) is DEAD;
- its job (when ``job_id`` is a Ray job id) is dead;
- the GCS does not know the controller or the job at all, ``UNKNOWN_GRACE_S`` after the actor first saw the
  run (an actor registers with the GCS a moment after its handle exists).

A run with neither a controller nor a Ray job id is never judged. (Runs restored from a snapshot that another
Ray cluster wrote, whose job ids a new cluster may reuse, are ended when they are loaded: see the actor.)

The check runs every ``interval_s`` on its own thread; each GCS query has a deadline, and a query that fails
leaves the run as it is until the next check.
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from elastrain.state._private.schemas import TrainRunInfo

logger = logging.getLogger("elastrain.state")

UNKNOWN_GRACE_S = 60.0
QUERY_TIMEOUT_S = 10.0
_RAY_JOB_ID = re.compile(r"^[0-9a-f]{8}$")


@dataclass(frozen=True)
class Job:
    dead: bool


@dataclass(frozen=True)
class Facts:
    """What the GCS said about one run's controller and job (None: it does not know them)."""

    controller_state: str | None = None
    job: Job | None = None


def is_ray_job_id(job_id: str) -> bool:
    return _RAY_JOB_ID.match(job_id) is not None


def abandoned(*, controller_actor_id: str | None, job_id: str, facts: Facts, seen_for_s: float) -> str | None:
    """Why the run is abandoned, or None when it may still be going."""
    known_long_enough = seen_for_s >= UNKNOWN_GRACE_S
    if controller_actor_id is not None:
        if facts.controller_state == "DEAD":
            return "The run's controller actor is dead: its driver exited (or dropped its executor) without ending it."
        if facts.controller_state is None and known_long_enough:
            return "Ray does not know the run's controller actor: it belonged to a driver (or cluster) that is gone."
    if is_ray_job_id(job_id):
        if facts.job is None:
            if known_long_enough:
                return f"Ray does not know the run's job {job_id}: it belonged to a driver (or cluster) that is gone."
        elif facts.job.dead:
            return f"The run's job {job_id} ended (its driver exited) without ending the run."
    return None


class Gcs:
    """The GCS queries the check needs, all of one check at once; only usable inside a Ray worker process."""

    def facts(self, runs: list[tuple[str | None, str]]) -> dict[tuple[str | None, str], Facts]:
        """Facts for each (controller actor id, job id); a pair whose query failed is left out."""
        return asyncio.run(self._facts(runs))

    async def _facts(self, runs: list[tuple[str | None, str]]) -> dict[tuple[str | None, str], Facts]:
        import ray
        from ray.core.generated import gcs_pb2

        worker: Any = ray._private.worker.global_worker  # Ray's own types do not declare these
        client = worker.gcs_client
        actor_states: Any = gcs_pb2.ActorTableData.ActorState  # type: ignore[attr-defined]
        controllers = sorted({controller for controller, _ in runs if controller is not None})
        jobs = sorted({job_id for _, job_id in runs if is_ray_job_id(job_id)})

        async def controller_state(actor_id: str) -> str | None:
            found = await client.async_get_all_actor_info(
                actor_id=ray.ActorID(bytes.fromhex(actor_id)), timeout=QUERY_TIMEOUT_S
            )
            for entry in found.values():
                return str(actor_states.Name(entry.state))
            return None

        async def job(job_id: str) -> Job | None:
            found = await client.async_get_all_job_info(
                job_or_submission_id=job_id,
                skip_submission_job_info_field=True,
                skip_is_running_tasks_field=True,
                timeout=QUERY_TIMEOUT_S,
            )
            for key, entry in found.items():
                if key.hex() == job_id:
                    return Job(dead=bool(entry.is_dead))
            return None

        answers = await asyncio.gather(
            *(controller_state(c) for c in controllers), *(job(j) for j in jobs), return_exceptions=True
        )
        states = dict(zip(controllers, answers[: len(controllers)], strict=True))
        found_jobs = dict(zip(jobs, answers[len(controllers) :], strict=True))
        facts = {}
        for controller, job_id in runs:
            state = states.get(controller) if controller is not None else None
            job_facts = found_jobs.get(job_id)
            if isinstance(state, BaseException) or isinstance(job_facts, BaseException):
                continue  # not judged this time
            facts[(controller, job_id)] = Facts(controller_state=state, job=job_facts)  # type: ignore[arg-type]
        return facts


class Watch:
    """The thread that checks, every ``interval_s``, the runs ``live_runs()`` returns and ends the abandoned
    ones with ``abort(run_id, reason)`` (True when that changed the run)."""

    def __init__(
        self,
        interval_s: float,
        live_runs: Callable[[], list[TrainRunInfo]],
        abort: Callable[[str, str], bool],
        gcs: Gcs | None = None,
    ) -> None:
        self._interval = interval_s
        self._live_runs, self._abort = live_runs, abort
        self._gcs = gcs or Gcs()
        self._first_seen: dict[str, float] = {}
        self.checks = 0
        self.aborted = 0
        self.error: str | None = None
        threading.Thread(target=self._main, name="elastrain-state-liveness", daemon=True).start()

    def _main(self) -> None:
        stop = threading.Event()  # never set: the thread lives as long as the actor
        while not stop.wait(self._interval):
            try:
                self.check()
            except Exception as failure:  # the GCS may be restarting: the next check tries again
                if self.error is None:
                    logger.warning("Checking whether runs' drivers are alive failed: %s", failure)
                self.error = str(failure)

    def check(self) -> None:
        runs = self._live_runs()
        now = time.monotonic()
        self._first_seen = {run.id: self._first_seen.get(run.id, now) for run in runs}
        facts = self._gcs.facts([(run.controller_actor_id, run.job_id) for run in runs]) if runs else {}
        for run in runs:
            found = facts.get((run.controller_actor_id, run.job_id))
            if found is None:
                continue
            reason = abandoned(
                controller_actor_id=run.controller_actor_id,
                job_id=run.job_id,
                facts=found,
                seen_for_s=now - self._first_seen[run.id],
            )
            if reason is not None and self._abort(run.id, reason):
                self.aborted += 1
        self.checks += 1
        self.error = None

    def info(self) -> dict[str, Any]:
        return {"interval_s": self._interval, "checks": self.checks, "aborted": self.aborted, "error": self.error}
