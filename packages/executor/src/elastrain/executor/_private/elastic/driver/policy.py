"""When an elastic job counts a worker as failed, a host as bad, and itself as unable to go on."""

from __future__ import annotations

import logging
import time

from elastrain.discovery import HostManager
from elastrain.executor._private.elastic.coordinator import CoordinatorReport
from elastrain.executor._private.elastic.driver.pool import Phase, PoolWorker, WorkerPool
from elastrain.executor._private.errors import ElasticJobError
from elastrain.executor._private.options import ExecutorOptions
from elastrain.executor._private.placement import node_alive

logger = logging.getLogger("elastrain.executor")

# Workers that die before they ever joined a group, this many times in a row on one host, mark the host bad.
_STARTUP_FAILURES_BEFORE_BLACKLIST = 3
# After a spare worker died or landed where it could not be used, no new spare for this long, doubling with
# every further miss (a broken or blacklisted node with room would otherwise catch spare after spare).
_SPARE_COOLDOWN_S = 30.0
_SPARE_COOLDOWN_MAX_S = 600.0
# While the job waits for min_workers (at its start or later), it says what it waits for this often.
WAITING_NOTICE_S = 10.0


class FailurePolicy:
    def __init__(
        self,
        options: ExecutorOptions,
        manager: HostManager,
        *,
        startup_grace_s: float,
        arrival_timeout_s: float,
    ) -> None:
        self.options = options
        self.manager = manager
        self.startup_grace_s = startup_grace_s
        self.arrival_timeout_s = arrival_timeout_s
        self._startup_failures: dict[str, int] = {}
        self._below_min_since: float | None = None
        self._next_waiting_notice = 0.0
        self._no_spare_until = 0.0
        self._spare_misses = 0

    # -- deaths and hosts ------------------------------------------------------------------------------------

    def worker_died(self, worker: PoolWorker, reason: str) -> None:
        if worker.phase is Phase.SPARE:
            logger.info("Spare worker %s went away: %s", worker.worker_id, reason)
            self.spare_missed()
            return
        logger.warning("Worker %s on host %s failed: %s", worker.worker_id, worker.host_id, reason)
        if worker.node is not None and not node_alive(worker.node.node_id):
            self.manager.blacklist(worker.host_id)
            return
        if worker.phase in (Phase.STARTING, Phase.READY):  # never held committed state
            failures = self._startup_failures.get(worker.host_id, 0) + 1
            self._startup_failures[worker.host_id] = failures
            if failures >= _STARTUP_FAILURES_BEFORE_BLACKLIST:
                self.manager.blacklist(worker.host_id)
        else:
            self._startup_failures.pop(worker.host_id, None)

    # -- spares ----------------------------------------------------------------------------------------------

    def spare_allowed(self) -> bool:
        return time.monotonic() >= self._no_spare_until

    def spare_used(self) -> None:
        self._spare_misses = 0

    def spare_missed(self) -> None:
        cooldown = min(_SPARE_COOLDOWN_S * 2**self._spare_misses, _SPARE_COOLDOWN_MAX_S)
        self._spare_misses += 1
        self._no_spare_until = time.monotonic() + cooldown

    # -- who must go -----------------------------------------------------------------------------------------

    def slow_starts(self, pool: WorkerPool) -> list[PoolWorker]:
        """Workers that have not started within the start-up grace (say, no node can host them)."""
        now = time.monotonic()
        return [w for w in pool.in_phase(Phase.STARTING) if now - w.spawned_at > self.startup_grace_s]

    def silent(self, report: CoordinatorReport, pool: WorkerPool) -> list[tuple[PoolWorker, str]]:
        """Running workers whose heartbeat stopped (frozen, or on a host that no longer answers)."""
        found = []
        for worker_id, seconds in report.silent.items():
            worker = pool.get(worker_id)
            if worker is not None and worker.phase in (Phase.READY, Phase.MEMBER, Phase.LEAVING):
                found.append((worker, f"no heartbeat for {seconds:.1f} s"))
        return found

    def never_arrived(
        self, report: CoordinatorReport, pool: WorkerPool, after_failure: bool
    ) -> list[tuple[PoolWorker, str]]:
        """Members of a world formed after a failure that have not come within ``arrival_timeout_s`` while still
        beating: alive but stuck (a hung collective or data loader), since every survivor's next collective fails
        at once and a worker that computes for longer between collectives would time out its peers anyway.

        A world that only adds or removes workers waits for its survivors' next commit, however far off.
        """
        if report.missing is None or not after_failure:
            return []
        _, waited_s, absent = report.missing
        if waited_s <= self.arrival_timeout_s:
            return []
        found = []
        for worker_id in absent:
            worker = pool.get(worker_id)
            if worker is not None and worker.phase is Phase.MEMBER:
                found.append((worker, f"did not arrive in its new group within {self.arrival_timeout_s:g} s"))
        return found

    # -- the job as a whole ----------------------------------------------------------------------------------

    def check_minimum(self, pool: WorkerPool) -> None:
        """Raise ElasticJobError after elastic_timeout below min_workers; say what the job waits for meanwhile."""
        alive = len(pool.counted())
        if alive >= self.options.num_workers:
            self._below_min_since = None
            return
        now = time.monotonic()
        if self._below_min_since is None:
            self._below_min_since = now
            self._next_waiting_notice = now + WAITING_NOTICE_S
            return
        waited = now - self._below_min_since
        if waited > self.options.elastic_timeout:
            raise ElasticJobError(
                f"The elastic job had fewer than min_workers={self.options.num_workers} workers for more than "
                f"elastic_timeout={self.options.elastic_timeout} s ({self.describe(pool)})."
            )
        if now >= self._next_waiting_notice:
            self._next_waiting_notice = now + WAITING_NOTICE_S
            logger.info(
                "Waiting for min_workers=%s workers (%s); giving up in %.0f s.",
                self.options.num_workers,
                self.describe(pool),
                self.options.elastic_timeout - waited,
            )

    def describe(self, pool: WorkerPool) -> str:
        running = len(pool.in_phase(Phase.READY, Phase.MEMBER))
        starting = len(pool.in_phase(Phase.STARTING))
        hosts = {h: i.slots for h, i in self.manager.current_hosts.items()}
        return (
            f"{running} running, {starting} starting; hosts and slots: {hosts}; "
            f"blacklisted: {sorted(self.manager.blacklisted_hosts())}"
        )
