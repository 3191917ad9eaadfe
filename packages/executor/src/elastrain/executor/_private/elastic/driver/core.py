"""The pure core of an elastic job's driver: events in, one ``step``, actions out. No Ray, no threads, no clock.

It keeps workers on the hosts discovery reports and forms groups, and never restarts survivors. Workers that crash
or stop answering are replaced; survivors roll back to their last commit and go on in a smaller group at once,
and replacements or workers on new hosts join at the survivors' next commit, once they are up (a new actor costs
seconds; the survivors don't wait for it). Workers on a host that discovery drops leave at the next commit, and
nobody rolls back.

The job's phase and each worker's lifecycle are the state machines of ``lifecycle.py``; when a worker counts as
failed and when the job gives up is ``policy.py``'s call; spare workers are ``spares.py``'s.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from elastrain.executor._private.elastic.coordinator import CoordinatorReport
from elastrain.executor._private.elastic.driver import events as ev
from elastrain.executor._private.elastic.driver.config import CoreConfig, ElasticStats
from elastrain.executor._private.elastic.driver.finishing import Result, Results
from elastrain.executor._private.elastic.driver.lifecycle import COUNTED, HOLDING, TERMINAL, JobPhase, move
from elastrain.executor._private.elastic.driver.lifecycle import WorkerPhase as W
from elastrain.executor._private.elastic.driver.policy import FailurePolicy
from elastrain.executor._private.elastic.driver.roster import Roster, WorkerRecord
from elastrain.executor._private.elastic.driver.spares import Spares
from elastrain.executor._private.elastic.world import World, make_world
from elastrain.executor._private.errors import ElasticJobError, VersionMismatchError

logger = logging.getLogger("elastrain.executor")
# A published group's log line names this many members; a group of thousands would make each line megabytes.
_LOGGED_MEMBERS = 64


@dataclass
class _Round:
    """What one round of events changed, for the decisions at its end."""

    gained: bool = False  # a worker became ready
    lost: bool = False  # a worker died
    failed: bool = False  # the current group failed without a death Ray knows of
    evicted: bool = False
    changed: bool = False  # a host shrank


class DriverCore:
    def __init__(self, config: CoreConfig, *, strict: bool = False) -> None:
        self.config = config
        self.strict = strict
        self.phase = JobPhase.STARTING
        self.roster = Roster(strict=strict)
        self.policy = FailurePolicy(
            min_workers=config.min_workers,
            elastic_timeout=config.elastic_timeout,
            startup_grace_s=config.startup_grace_s,
            arrival_timeout_s=config.arrival_timeout_s,
        )
        self.stats = ElasticStats()
        self.spares = Spares(self)
        self.hosts = ev.Hosts({})
        self.world: World | None = None
        self.results = Results()
        self._reported: set[str] = set()  # members of the current group whose exit observers have not heard of
        self._roll_call: tuple[_Round, str] | None = None  # the round waiting for a RollCallDone, and its reason
        self._actions: list[ev.Action] = []

    # -- the step ---------------------------------------------------------------------------------------------

    def step(self, now: float, events: Sequence[ev.Event]) -> list[ev.Action]:
        """Apply ``events`` (in order) at time ``now``; the actions to carry out, in order."""
        if self.phase in TERMINAL:
            return []  # a finished job emits nothing more
        self._actions = []
        try:
            self._step(now, events)
        except ElasticJobError as error:
            self._end(JobPhase.FAILED, ev.Fail(error))
        return self._actions

    def _step(self, now: float, events: Sequence[ev.Event]) -> None:
        round_ = _Round()
        for event in events:
            if self.phase in TERMINAL:
                return
            if isinstance(event, ev.StopRequested):
                raise ElasticJobError(f"The elastic job was stopped: {event.reason}.")
            if isinstance(event, ev.HostsSeen):
                self.hosts = event.hosts
            elif isinstance(event, ev.HostShrunk):
                if self.phase is not JobPhase.FINISHING:
                    round_.changed |= self._shrink_host(event.host_id, event.slots)
            elif isinstance(event, ev.Prepared):
                round_.gained |= self._on_prepared(event, now)
            elif isinstance(event, ev.PrepareFailed):
                self._on_prepare_failed(event, now)
            elif isinstance(event, ev.Finished | ev.Removed | ev.Died):
                round_.lost |= self._on_run_ended(event, now)
            elif isinstance(event, ev.Raised):
                worker = self.roster.get(event.worker_id)
                if worker is not None:
                    self._exited(worker, "CRASHED", event.detail)
                self._end(JobPhase.FAILED, ev.Fail(event.error))
            elif isinstance(event, ev.Polled):
                self._on_polled(event.report, round_, now)
            elif isinstance(event, ev.RollCallDone):
                round_ = self._on_roll_call_done(event, now)
        if self._roll_call is None and self.phase not in TERMINAL:
            self._decide(round_, now)

    def _decide(self, round_: _Round, now: float) -> None:
        if self.results.finished:
            if self.phase is not JobPhase.FINISHING:
                self._set_phase(JobPhase.FINISHING)
                first = self.results.finished[0]
                if first.generation:
                    logger.info(
                        "Worker %s finished in group %s; waiting for that group's others.",
                        first.worker_id,
                        first.generation,
                    )
            results = self.results.complete(self.roster)
            if results is not None:
                self._end(JobPhase.FINISHED, ev.Finish(tuple(results)))
            return
        changed = round_.changed or self._hand_off_done()
        for worker in self.policy.slow_starts(self.roster, now):
            self._fail(worker, f"did not start within {self.policy.startup_grace_s} s", now)
            self.stop(worker)
        self.policy.check_minimum(self.roster, self.hosts, now)
        self._fill(now)
        broken = round_.lost or round_.failed or round_.evicted
        # A loss is published at once (survivors are waiting); workers that are still starting get a moment more,
        # so that several newcomers join in one reset rather than one reset each.
        ready = round_.gained or bool(self.roster.count(W.READY))
        if broken or changed or (ready and not self.policy.starting_recently(self.roster, now)):
            self._publish(force=round_.failed, after_failure=broken)

    def _end(self, phase: JobPhase, action: ev.Action) -> None:
        self._set_phase(phase)
        self._actions.append(action)

    # -- workers ----------------------------------------------------------------------------------------------

    def spawn(self, host_id: str, now: float) -> WorkerRecord:
        if host_id and host_id not in self.hosts.slots:
            raise AssertionError(f"DEBUG spawn on {host_id} not in {dict(self.hosts.slots)}")
        worker = self.roster.add(host_id, W.STARTING if host_id else W.SPARE, now)
        self._actions.append(ev.Spawn(worker.worker_id, host_id))
        if host_id:
            logger.info("Starting worker %s on host %s.", worker.worker_id, host_id)
        else:
            logger.debug("Keeping spare worker %s for a node that may join.", worker.worker_id)
        return worker

    def forget(self, worker: WorkerRecord) -> None:
        self.roster.move(worker, W.GONE)
        self._actions.append(ev.Forget(worker.worker_id))

    def stop(self, worker: WorkerRecord, *, unresponsive: bool = False) -> None:
        self.roster.move(worker, W.STOPPING)
        self._actions.append(ev.Stop(worker.worker_id, unresponsive))

    def _fail(self, worker: WorkerRecord, reason: str, now: float, *, node_lost: bool = False) -> None:
        """Count ``worker`` as failed (before its phase changes: the policy reads it)."""
        bad_host = self.policy.worker_failed(worker, reason, now)
        if worker.phase is not W.SPARE:
            self._actions.append(ev.WorkerFailed(worker.worker_id, worker.host_id, reason, check_node=not node_lost))
        if node_lost and worker.host_id:
            self._drop_host(worker.host_id)
        elif bad_host is not None:
            self._actions.append(ev.Blacklist(bad_host))

    def _drop_host(self, host_id: str) -> None:
        """Blacklist ``host_id`` and take it out of this step's view, so nothing starts there before discovery
        catches up."""
        slots = {h: n for h, n in self.hosts.slots.items() if h != host_id}
        self.hosts = ev.Hosts(slots, self.hosts.blacklisted | {host_id})
        self._actions.append(ev.Blacklist(host_id))

    def _fill(self, now: float) -> None:
        """Start workers on free slots, up to max_workers."""
        if self.phase is JobPhase.FINISHING:
            return
        limit = self.config.max_workers or sum(self.hosts.slots.values())
        limit -= limit % self.config.size_multiple  # a worker beyond the last whole block would only sit idle
        count = self.roster.count(*COUNTED)
        if count >= limit:  # the usual round of a running job: nothing to start, nothing to count per host
            if self.config.spare_worker:
                self.spares.keep_one(count, now)
            return
        per_host: dict[str, int] = {}
        for worker in self.roster.in_phase(*HOLDING):
            per_host[worker.host_id] = per_host.get(worker.host_id, 0) + 1  # a leaving worker holds its slot
        for host_id, slots in self.hosts.slots.items():
            if count >= limit:
                break
            while count < limit and per_host.get(host_id, 0) < slots:
                self.spawn(host_id, now)
                per_host[host_id] = per_host.get(host_id, 0) + 1
                count += 1
        if self.config.spare_worker:
            self.spares.keep_one(count, now)

    def _on_prepared(self, event: ev.Prepared, now: float) -> bool:
        worker = self.roster.get(event.worker_id)
        if worker is None:
            return False
        worker.node_id = event.node_id
        if worker.phase is W.STOPPING or (self.phase is JobPhase.FINISHING and self.results.generation):
            if worker.phase is not W.STOPPING:
                self.stop(worker)
            self.forget(worker)
            return False
        if worker.phase is W.SPARE and not self.spares.adopt(worker, event.node_id, now):
            return False
        self.roster.move(worker, W.READY)
        self._actions.append(ev.StartRun(worker.worker_id))
        return True

    def _on_prepare_failed(self, event: ev.PrepareFailed, now: float) -> None:
        worker = self.roster.get(event.worker_id)
        if worker is None:
            return
        if event.incompatible:  # retrying on its host cannot help: the job goes on without that host
            logger.error("%s Host %s is left out of this job.", event.reason, worker.host_id or "(a spare's)")
            if worker.host_id:
                self._drop_host(worker.host_id)
        elif worker.phase is not W.STOPPING:
            self._fail(worker, f"failed to start: {event.reason}", now)
        self.forget(worker)
        if event.incompatible and self.phase is JobPhase.STARTING:
            # Before the first group it is the set-up that is wrong: say so now, not after elastic_timeout.
            self._end(JobPhase.FAILED, ev.Fail(VersionMismatchError(event.reason)))

    def _on_run_ended(self, event: ev.Finished | ev.Removed | ev.Died, now: float) -> bool:
        """The worker's call ended: whether it died unexpectedly."""
        worker = self.roster.get(event.worker_id)
        if worker is None:
            return False
        died = isinstance(event, ev.Died) and worker.phase not in (W.STOPPING, W.LEAVING)
        if isinstance(event, ev.Died) and died:
            self._fail(worker, event.reason, now, node_lost=event.node_lost)
            self._exited(worker, "CRASHED", event.reason)
        elif isinstance(event, ev.Died) and event.node_lost and worker.host_id in self.hosts.slots:
            # A worker already stopping died with its node: not a failure, but nothing may start there now.
            self._drop_host(worker.host_id)
        if isinstance(event, ev.Finished):
            self.results.finished.append(
                Result(event.generation, event.rank, event.value, worker.spawned_at, worker.worker_id)
            )
        self.forget(worker)
        return died

    def _evict(self, worker: WorkerRecord, reason: str, now: float) -> None:
        """Stop a worker that is alive to Ray but not to the job; its peers' collectives fail once it is gone."""
        logger.warning("Evicting worker %s on host %s: %s.", worker.worker_id, worker.host_id, reason)
        self._fail(worker, reason, now)
        self._exited(worker, "CRASHED", f"evicted: {reason}")
        self.stop(worker, unresponsive=True)
        self.stats.evictions += 1

    def _lost(self, worker: WorkerRecord, reason: str, now: float) -> None:
        """A member that is dead to the job although Ray does not know yet: counted as a death, not an eviction."""
        logger.warning("Worker %s on host %s is gone: %s.", worker.worker_id, worker.host_id, reason)
        self._fail(worker, reason, now)
        self._exited(worker, "CRASHED", reason)
        self.stop(worker, unresponsive=True)

    def _shrink_host(self, host_id: str, slots: int) -> bool:
        """Members beyond the host's slots leave at their next commit (no rollback); others stop now."""
        on_host = [w for w in self.roster.counted() if w.host_id == host_id]
        extra = on_host[slots:] if slots else on_host
        for worker in reversed(extra):
            if worker.phase is W.MEMBER:
                self.roster.move(worker, W.LEAVING)
                logger.info("Worker %s leaves at its next commit: host %s went away.", worker.worker_id, host_id)
                self._exited(worker, "REMOVED", f"its host {host_id} went away")
            else:
                self.stop(worker)
                logger.info("Stopping worker %s: host %s went away.", worker.worker_id, host_id)
        return bool(extra)

    def _exited(self, worker: WorkerRecord, status: str, detail: str) -> None:
        """Tell observers that a member of the current group crashed or was let go (once; others are no news)."""
        if worker.worker_id in self._reported:
            self._reported.discard(worker.worker_id)
            if self.phase is not JobPhase.FINISHING:
                self._actions.append(ev.Exited(worker.worker_id, status, detail))

    # -- the rendezvous ---------------------------------------------------------------------------------------

    def _on_polled(self, report: CoordinatorReport, round_: _Round, now: float) -> None:
        """Act on what the rendezvous actor saw: silent or absent workers, failed groups, arrivals, run events."""
        gone = tuple(worker_id for worker_id in report.silent if self.roster.get(worker_id) is None)
        if gone:
            self._actions.append(ev.ForgetBeats(gone))
        for _, kind, fields in report.events:
            self._actions.append(ev.RunEvent(kind, fields))
        world = self.world
        arrived = world is not None and (report.missing is None or report.missing[0] != world.generation)
        if arrived and self.phase in (JobPhase.FORMING, JobPhase.RECOVERING):
            self._set_phase(JobPhase.RUNNING)
        evictions = self.policy.silent(report, self.roster)
        if self.phase is JobPhase.RECOVERING:
            evictions += self.policy.never_arrived(report, self.roster)
        for worker, reason in evictions:
            if worker.phase is not W.STOPPING:
                self._evict(worker, reason, now)
        current = [r for r in report.failures if world is not None and r[1] == world.generation]
        if current and self.phase is JobPhase.FINISHING:
            # The group failed after a member finished: no new group forms; those still in it end without a result.
            for worker_id, _, reason in current:
                failed = self.roster.get(worker_id)
                if failed is not None and failed.phase is not W.STOPPING:
                    logger.warning(
                        "Stopping worker %s: its group failed after another member finished (%s).", worker_id, reason
                    )
                    self.stop(failed, unresponsive=True)
            return
        round_.evicted |= bool(evictions)
        if not current:
            return
        reporters = frozenset(worker_id for worker_id, _, _ in current)
        members = self.roster.in_phase(W.MEMBER)
        if all(w.worker_id in reporters for w in members):
            self._group_failed(round_, current[0][2])
            return
        # Survivors often report a failed collective before Ray tells the shell that a peer died: ask who lives.
        self._roll_call = (round_, current[0][2])
        self._actions.append(ev.RollCall(reporters, tuple(w.worker_id for w in members)))

    def _on_roll_call_done(self, event: ev.RollCallDone, now: float) -> _Round:
        round_, reason = self._roll_call or (_Round(), "")
        self._roll_call = None
        if event.death_on_its_way:
            return round_  # the next round forms the group without the dead worker, once Ray says it died
        for worker_id in event.gone:
            worker = self.roster.get(worker_id)
            if worker is not None and worker.phase in (W.MEMBER, W.LEAVING):
                reason = f"did not answer within {event.waited_s:.2f} s after its group failed (its node lost?)"
                self._lost(worker, reason, now)
        self._group_failed(round_, reason)
        return round_

    def _group_failed(self, round_: _Round, reason: str) -> None:
        round_.failed = True
        generation = self.world.generation if self.world is not None else 0
        logger.warning("Group %s failed (%s); forming a new one.", generation, reason)

    # -- groups -----------------------------------------------------------------------------------------------

    def _publish(self, *, force: bool, after_failure: bool) -> None:
        """Publish the running workers as a new group (``force``: even when they are the current group's)."""
        if self.phase is JobPhase.FINISHING:
            return
        running = self.roster.in_phase(W.READY, W.MEMBER)
        if not any(w.phase is W.MEMBER for w in running):
            # Without them no member would hold the committed state: leaving members stay for one more group,
            # whose sync hands their state to the newcomers, and leave after it.
            running += self.roster.leaving_members(self.world)
        ready, left_out = self._whole_multiples(running)
        if len(ready) < self.config.min_workers:
            if self.roster.group_broken(self.world) and self.phase in (
                JobPhase.RUNNING,
                JobPhase.FORMING,
                JobPhase.RECOVERING,
            ):
                self._set_phase(JobPhase.WAITING)  # survivors wait in join until enough workers are up
            return
        same = self.world is not None and {m.worker_id for m in self.world.members} == {w.worker_id for w in ready}
        if same and not force:
            return
        if self.world is not None:
            self.stats.resets += 1
            limit = self.config.reset_limit
            if limit is not None and self.stats.resets > limit:
                raise ElasticJobError(
                    f"The elastic job needed reset {self.stats.resets}, beyond reset_limit={limit}; raise "
                    "reset_limit or fix what keeps failing."
                )
        # Members of a group formed after a failure must come promptly; that stays so until they all came.
        recovering = after_failure or self.phase in (JobPhase.RECOVERING, JobPhase.WAITING)
        self._set_phase(JobPhase.RECOVERING if recovering else JobPhase.FORMING)
        generation = self.world.generation + 1 if self.world is not None else 1
        for worker in left_out:
            if worker.phase is W.MEMBER:
                self.roster.move(worker, W.READY)
                worker.held = True
                logger.info(
                    "Worker %s waits outside group %s: groups have a multiple of %s workers (size_multiple).",
                    worker.worker_id,
                    generation,
                    self.config.size_multiple,
                )
        held = [w.worker_id for w in left_out if w.held]
        self.world = make_world(generation, ready, list(self.hosts.slots), held)
        self.results.members_by_generation[generation] = frozenset(m.worker_id for m in self.world.members)
        for worker in ready:
            if worker.phase is W.READY:
                self.roster.move(worker, W.MEMBER)
                worker.held = False
        self.stats.worlds.append(self.world.size)
        self._reported = {m.worker_id for m in self.world.members}
        self._actions.append(ev.Publish(self.world, self.stats.resets))
        if logger.isEnabledFor(logging.INFO):
            members = self.world.members
            listed = ", ".join(f"{m.worker_id}@{m.slot.host_id}" for m in members[:_LOGGED_MEMBERS])
            more = f" and {len(members) - _LOGGED_MEMBERS} more" if len(members) > _LOGGED_MEMBERS else ""
            logger.info("Published group %s: %s%s.", generation, listed, more)

    def _whole_multiples(self, running: list[WorkerRecord]) -> tuple[list[WorkerRecord], list[WorkerRecord]]:
        """The workers the next group takes, a whole multiple of ``size_multiple``, and those it leaves out.

        The current group's blocks of ``size_multiple`` consecutive ranks (an HSDP replica group each, on a
        ``(replicas, size_multiple)`` mesh) that lost nobody come first, so an untouched replica group stays whole
        and keeps its shards; then the other members, by rank; then newcomers, in the order they started. Ranks
        still follow the hosts (``make_world``): a sharded state puts each whole replica group back in one row of
        its new mesh (``shard_plan.arrange_mesh``).
        """
        multiple = self.config.size_multiple
        if multiple == 1:
            return running, []
        ranks = {m.worker_id: m.slot.rank for m in self.world.members} if self.world is not None else {}
        alive = Counter(ranks[w.worker_id] // multiple for w in running if w.worker_id in ranks)

        def order(worker: WorkerRecord) -> tuple[int, int]:
            rank = ranks.get(worker.worker_id)
            if rank is None:
                return 2, 0  # a newcomer, or a worker held earlier: sorted() keeps their order
            return (0 if alive[rank // multiple] == multiple else 1), rank

        ordered = sorted(running, key=order)
        size = len(ordered) // multiple * multiple
        return ordered[:size], ordered[size:]

    def _hand_off_done(self) -> bool:
        """Leaving workers stayed in the current group for its sync, which is over: they can go now."""
        if self.phase is not JobPhase.RUNNING or self.world is None or not self.roster.leaving_members(self.world):
            return False
        members = [self.roster.get(m.worker_id) for m in self.world.members]
        return any(w is not None and w.phase is W.MEMBER for w in members)

    # -- small helpers ----------------------------------------------------------------------------------------

    def _set_phase(self, phase: JobPhase) -> None:
        self.phase = move(self.phase, phase, what="the job", strict=self.strict)

    def rank_of(self, worker_id: str) -> int:
        member = self.world.member(worker_id) if self.world is not None else None
        return member.slot.rank if member is not None else -1
