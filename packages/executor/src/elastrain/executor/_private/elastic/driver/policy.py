"""When an elastic job counts a worker as failed, a host as bad, and itself as unable to go on (pure: the caller
passes the time)."""

from __future__ import annotations

import logging

from elastrain.executor._private.elastic.coordinator import CoordinatorReport
from elastrain.executor._private.elastic.driver.events import Hosts
from elastrain.executor._private.elastic.driver.lifecycle import COUNTED, WorkerPhase
from elastrain.executor._private.elastic.driver.roster import Roster, WorkerRecord
from elastrain.executor._private.errors import ElasticJobError

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
        self, *, min_workers: int, elastic_timeout: float, startup_grace_s: float, arrival_timeout_s: float
    ) -> None:
        self.min_workers = min_workers
        self.elastic_timeout = elastic_timeout
        self.startup_grace_s = startup_grace_s
        self.arrival_timeout_s = arrival_timeout_s
        self._startup_failures: dict[str, int] = {}
        self._below_min_since: float | None = None
        self._next_waiting_notice = 0.0
        self._no_spare_until = 0.0
        self._spare_misses = 0

    def starting_recently(self, roster: Roster, now: float) -> bool:
        """Some worker is still starting, and not for longer than the start-up grace."""
        return any(now - w.spawned_at < self.startup_grace_s for w in roster.in_phase(WorkerPhase.STARTING))

    # -- deaths and hosts ------------------------------------------------------------------------------------

    def worker_failed(self, worker: WorkerRecord, reason: str, now: float) -> str | None:
        """Count a failure; the host to blacklist when its workers keep failing to start."""
        if worker.phase is WorkerPhase.SPARE:
            logger.info("Spare worker %s went away: %s", worker.worker_id, reason)
            self.spare_missed(now)
            return None
        logger.warning("Worker %s on host %s failed: %s", worker.worker_id, worker.host_id, reason)
        if worker.phase in (WorkerPhase.STARTING, WorkerPhase.READY) and not worker.held:  # a start that failed
            failures = self._startup_failures.get(worker.host_id, 0) + 1
            self._startup_failures[worker.host_id] = failures
            if failures >= _STARTUP_FAILURES_BEFORE_BLACKLIST:
                return worker.host_id
        else:
            self._startup_failures.pop(worker.host_id, None)
        return None

    # -- spares ----------------------------------------------------------------------------------------------

    def spare_allowed(self, now: float) -> bool:
        return now >= self._no_spare_until

    def spare_used(self) -> None:
        self._spare_misses = 0

    def spare_missed(self, now: float) -> None:
        cooldown = min(_SPARE_COOLDOWN_S * 2**self._spare_misses, _SPARE_COOLDOWN_MAX_S)
        self._spare_misses += 1
        self._no_spare_until = now + cooldown

    # -- who must go -----------------------------------------------------------------------------------------

    def slow_starts(self, roster: Roster, now: float) -> list[WorkerRecord]:
        """Workers that have not started within the start-up grace (say, no node can host them)."""
        return [w for w in roster.in_phase(WorkerPhase.STARTING) if now - w.spawned_at > self.startup_grace_s]

    def silent(self, report: CoordinatorReport, roster: Roster) -> list[tuple[WorkerRecord, str]]:
        """Running workers whose heartbeat stopped (frozen, or on a host that no longer answers)."""
        found = []
        for worker_id, seconds in report.silent.items():
            worker = roster.get(worker_id)
            if worker is not None and worker.phase in (WorkerPhase.READY, WorkerPhase.MEMBER, WorkerPhase.LEAVING):
                found.append((worker, f"no heartbeat for {seconds:.1f} s"))
        return found

    def never_arrived(self, report: CoordinatorReport, roster: Roster) -> list[tuple[WorkerRecord, str]]:
        """Members of a group formed after a failure that have not come within ``arrival_timeout_s`` while still
        beating: alive but stuck (a hung collective or data loader), since every survivor's next collective fails
        at once and a worker that computes for longer between collectives would time out its peers anyway.

        The caller asks only while the job recovers: a group that only adds or removes workers waits for its
        survivors' next commit, however far off.
        """
        if report.missing is None:
            return []
        _, waited_s, absent = report.missing
        if waited_s <= self.arrival_timeout_s:
            return []
        found = []
        for worker_id in absent:
            worker = roster.get(worker_id)
            if worker is not None and worker.phase is WorkerPhase.MEMBER:
                found.append((worker, f"did not arrive in its new group within {self.arrival_timeout_s:g} s"))
        return found

    # -- the job as a whole ----------------------------------------------------------------------------------

    def check_minimum(self, roster: Roster, hosts: Hosts, now: float) -> None:
        """Raise ElasticJobError after elastic_timeout below min_workers; say what the job waits for meanwhile."""
        if roster.count(*COUNTED) >= self.min_workers:
            self._below_min_since = None
            return
        if self._below_min_since is None:
            self._below_min_since = now
            self._next_waiting_notice = now + WAITING_NOTICE_S
            return
        waited = now - self._below_min_since
        if waited > self.elastic_timeout:
            raise ElasticJobError(
                f"The elastic job had fewer than min_workers={self.min_workers} workers for more than "
                f"elastic_timeout={self.elastic_timeout} s ({describe(roster, hosts)})."
            )
        if now >= self._next_waiting_notice:
            self._next_waiting_notice = now + WAITING_NOTICE_S
            logger.info(
                "Waiting for min_workers=%s workers (%s); giving up in %.0f s.",
                self.min_workers,
                describe(roster, hosts),
                self.elastic_timeout - waited,
            )


def describe(roster: Roster, hosts: Hosts) -> str:
    running = roster.count(WorkerPhase.READY, WorkerPhase.MEMBER)
    starting = roster.count(WorkerPhase.STARTING)
    return (
        f"{running} running, {starting} starting; hosts and slots: {dict(hosts.slots)}; "
        f"blacklisted: {sorted(hosts.blacklisted)}"
    )
