"""The rule that finds runs whose driver is gone, fact by fact (the real thing is in test_actor.py)."""

from __future__ import annotations

import pytest

from elastrain.state._private.liveness import UNKNOWN_GRACE_S, Facts, Job, abandoned

ALIVE_JOB = Job(dead=False)


def verdict(controller: str | None, job_id: str, facts: Facts, seen_for_s: float = 0.0) -> str | None:
    return abandoned(controller_actor_id=controller, job_id=job_id, facts=facts, seen_for_s=seen_for_s)


@pytest.mark.parametrize(
    ("controller", "job_id", "facts", "seen_for_s", "reason"),
    [
        ("c" * 32, "01000000", Facts("ALIVE", ALIVE_JOB), 1e6, None),
        ("c" * 32, "01000000", Facts("RESTARTING", ALIVE_JOB), 1e6, None),
        ("c" * 32, "01000000", Facts("PENDING_CREATION", ALIVE_JOB), 1e6, None),
        ("c" * 32, "01000000", Facts("DEAD", ALIVE_JOB), 0.0, "controller actor is dead"),
        ("c" * 32, "01000000", Facts(None, ALIVE_JOB), 0.0, None),  # not registered yet
        ("c" * 32, "01000000", Facts(None, ALIVE_JOB), UNKNOWN_GRACE_S, "does not know the run's controller"),
        (None, "01000000", Facts(None, ALIVE_JOB), 1e6, None),
        (None, "01000000", Facts(None, Job(dead=True)), 0.0, "ended"),
        (None, "01000000", Facts(None, None), 0.0, None),
        (None, "01000000", Facts(None, None), UNKNOWN_GRACE_S, "does not know the run's job"),
        (None, "my-own-job", Facts(None, None), 1e6, None),  # not a Ray job id: never judged by it
    ],
)
def test_abandoned(controller: str | None, job_id: str, facts: Facts, seen_for_s: float, reason: str | None) -> None:
    found = verdict(controller, job_id, facts, seen_for_s)
    if reason is None:
        assert found is None
    else:
        assert found is not None
        assert reason in found
