"""Spare workers: one worker asked for without a host, for Ray to place the moment a node with room joins."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from elastrain.executor._private.elastic.driver.lifecycle import WorkerPhase as W
from elastrain.executor._private.elastic.driver.roster import WorkerRecord

if TYPE_CHECKING:
    from elastrain.executor._private.elastic.driver.core import DriverCore

logger = logging.getLogger("elastrain.executor")


class Spares:
    def __init__(self, core: DriverCore) -> None:
        self.core = core

    def keep_one(self, count: int, now: float) -> None:
        """Below max_workers with every known slot taken, keep one worker waiting without a host.

        Ray places it the moment a node with room registers, before discovery's next poll; it starts (and
        imports torch) while discovery catches up, and joins once its node is a usable host.
        """
        core = self.core
        limit = core.config.max_workers
        if limit is None or count >= limit or not core.policy.spare_allowed(now):
            return
        if any(w.node_id is None for w in core.roster.in_phase(W.STARTING)):
            # A spare asked for now could take the CPUs that a worker still starting on a known host needs.
            return
        if not core.roster.count(W.SPARE):
            core.spawn("", now)

    def adopt(self, worker: WorkerRecord, host_id: str, now: float) -> bool:
        """Give a spare that Ray placed on node ``host_id`` that host, if it is usable and has a free slot."""
        core = self.core
        slots = core.hosts.slots.get(host_id)
        started = core.roster.in_phase(W.READY, W.MEMBER, W.LEAVING)
        if (
            slots is None
            or host_id in core.hosts.blacklisted
            or sum(1 for w in started if w.host_id == host_id) >= slots
            or sum(1 for w in started if w.phase is not W.LEAVING) >= (core.config.max_workers or 0)
        ):
            logger.info("Spare worker %s landed on %s, which it cannot use; stopping it.", worker.worker_id, host_id)
            core.stop(worker)
            core.forget(worker)
            core.policy.spare_missed(now)
            return False
        core.roster.move(worker, W.STARTING)
        worker.host_id = host_id
        core.policy.spare_used()
        core.stats.spares_used += 1
        logger.info("Spare worker %s joins from new host %s.", worker.worker_id, host_id)
        self._drop_redundant_starts(host_id, slots)
        return True

    def _drop_redundant_starts(self, host_id: str, slots: int) -> None:
        """Workers still starting that an adopted spare made redundant: on its host, or beyond max_workers."""
        core = self.core
        active = core.roster.counted()
        on_host = sum(1 for w in active if w.host_id == host_id)
        total, limit = len(active), core.config.max_workers or len(active)
        for worker in reversed(active):
            if worker.node_id is None and ((worker.host_id == host_id and on_host > slots) or total > limit):
                core.stop(worker)
                total -= 1
                on_host -= worker.host_id == host_id
