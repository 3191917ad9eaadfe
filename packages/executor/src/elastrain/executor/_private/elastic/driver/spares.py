"""Spare workers: one worker request without a host, for Ray to place the moment a node with room joins."""

from __future__ import annotations

import logging
from typing import Any

from elastrain.discovery import HostManager
from elastrain.executor._private.elastic.driver.policy import FailurePolicy
from elastrain.executor._private.elastic.driver.pool import Phase, PoolWorker, WorkerPool
from elastrain.executor._private.options import ExecutorOptions

logger = logging.getLogger("elastrain.executor")


class Spares:
    def __init__(
        self, options: ExecutorOptions, manager: HostManager, pool: WorkerPool, policy: FailurePolicy, stats: Any
    ) -> None:
        self.options = options
        self.manager = manager
        self.pool = pool
        self.policy = policy
        self.stats = stats  # the driver's ElasticStats: counts the spares that joined

    def keep_one(self, count: int) -> None:
        """Below max_workers with every known slot taken, keep one worker waiting without a host.

        Ray places it the moment a node with room registers, before discovery's next poll; it starts (and
        imports torch) while discovery catches up, and joins once its node is a usable host.
        """
        limit = self.options.max_workers
        if limit is None or count >= limit or not self.policy.spare_allowed():
            return
        if any(w.node is None for w in self.pool.in_phase(Phase.STARTING)):
            # A spare asked for now could take the CPUs that a worker still starting on a known host needs.
            return
        if not self.pool.in_phase(Phase.SPARE):
            self.pool.spawn_spare()

    def adopt(self, worker: PoolWorker, host_id: str) -> bool:
        """Give a spare that Ray placed on node ``host_id`` that host, if it is usable and has a free slot."""
        if host_id not in self.manager.current_hosts:
            self.manager.refresh()  # Ray saw the node before discovery's next poll
        host = self.manager.current_hosts.get(host_id)
        started = self.pool.in_phase(Phase.READY, Phase.MEMBER, Phase.LEAVING)
        if (
            host is None
            or host_id in self.manager.blacklisted_hosts()
            or sum(1 for w in started if w.host_id == host_id) >= host.slots
            or sum(1 for w in started if w.phase is not Phase.LEAVING) >= (self.options.max_workers or 0)
        ):
            logger.info("Spare worker %s landed on %s, which it cannot use; stopping it.", worker.worker_id, host_id)
            self.pool.stop(worker)
            self.pool.forget(worker)
            self.policy.spare_missed()
            return False
        worker.phase, worker.host_id = Phase.STARTING, host_id
        self.policy.spare_used()
        self.stats.spares_used += 1
        logger.info("Spare worker %s joins from new host %s.", worker.worker_id, host_id)
        self._drop_redundant_starts(host_id, host.slots)
        return True

    def _drop_redundant_starts(self, host_id: str, slots: int) -> None:
        """Workers still starting that an adopted spare made redundant: on its host, or beyond max_workers."""
        active = self.pool.counted()
        on_host = sum(1 for w in active if w.host_id == host_id)
        total, limit = len(active), self.options.max_workers or len(active)
        for worker in reversed(active):
            if worker.node is None and ((worker.host_id == host_id and on_host > slots) or total > limit):
                self.pool.stop(worker)
                total -= 1
                on_host -= worker.host_id == host_id
