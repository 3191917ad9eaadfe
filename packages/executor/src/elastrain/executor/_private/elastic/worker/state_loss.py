"""When no member of a world holds the committed state although the job had committed: the state was lost with
its last holders (say the last survivor of a crash died while it synced its replacement).

Every member reaches the same case from the same plan (``reset.py``): it resumes from the latest persisted copy,
starts over from its initial state where the user opted in, or fails the job with :class:`ElasticJobError`.
Going on from the initial state unasked would look like success while the training so far was lost.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from elastrain.executor._private.elastic.worker import runtime
from elastrain.executor._private.elastic.worker.reset import ResetPlan
from elastrain.executor._private.errors import ElasticJobError

if TYPE_CHECKING:
    from elastrain.executor._private.elastic.worker.state import State

logger = logging.getLogger("elastrain.executor")


def resume_persisted(state: State, plan: ResetPlan, persistence: Any, name: Any) -> None:
    """Every member loads the latest persisted copy; the run learns how many commits were lost, if any."""
    snapshot, commits = persistence.load(name)
    state.load_snapshot(snapshot, commits)
    state._book.synced = True
    runtime.held_commits(commits)
    lost = max(plan.high_water - commits, 0)
    if lost:
        logger.warning(
            "The committed state was lost with its last holder(s) at %d commits; resuming from the latest persisted "
            "copy (%d commits): the %d commits after it are lost and redone.",
            plan.high_water,
            commits,
            lost,
        )
    if plan.rank == plan.source:
        fields = {"generation": plan.generation, "commits": commits, "high_water": plan.high_water}
        runtime.current().report_event("state_resumed_from_persistence", {**fields, "lost_commits": lost})


def start_over(state: State, plan: ResetPlan) -> None:
    """The user opted in: every member rolls back to the committed copy it holds, its initial state (a failed
    sync never touches it), and the sync that follows makes the source's the world's."""
    logger.warning(
        "The committed state was lost with its last holder(s) at %d commits, and nothing persisted it; starting over "
        "from the initial state, as start_over_on_state_loss=True asks.",
        plan.high_water,
    )
    state.restore()
    job = runtime.current()
    if plan.rank == plan.source:
        job.report_event("state_lost_start_over", {"generation": plan.generation, "lost_commits": plan.high_water})
    job.state_started_over()


def state_lost_error(plan: ResetPlan, persisted: bool) -> ElasticJobError:
    """What every member raises when no worker holds the committed state any more and nothing can bring it back."""
    where = (
        "and its persistence holds no copy yet"
        if persisted
        else "and nothing persisted it (the state has no persist_with)"
    )
    return ElasticJobError(
        f"The elastic job's committed state was lost with its last holder(s): it had reached {plan.high_water} "
        f"commits, no worker of group {plan.generation} holds any of them, {where}. Going on would silently train "
        "from the initial state. Persist the state (state.persist_with(elastrain.durable.StatePersistence(uri))) "
        "so that the job resumes from its latest copy, or pass "
        "RayExecutor.create_settings(start_over_on_state_loss=True) to start over from the initial state instead."
    )
