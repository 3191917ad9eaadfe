"""The driver of an elastic job: keeps workers on the hosts discovery reports, forms worlds, never restarts
survivors.

Workers that crash or stop answering are replaced; survivors roll back to their last commit and go on in a
smaller world at once, and replacements or workers on new hosts join at the survivors' next commit, once they
are up (a new actor costs seconds; the survivors don't wait for it). Workers on a host that discovery drops
leave at the next commit, and nobody rolls back. The workers themselves live in ``pool.py``; when one counts as
failed, and when the job gives up, is ``policy.py``'s call.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from elastrain.discovery import AllHostsBlacklistedError, HostChange, HostEvent, HostManager, HostManagerStoppedError
from elastrain.executor._private.elastic.coordinator import CONTROL_TIMEOUT_S
from elastrain.executor._private.elastic.driver.policy import WAITING_NOTICE_S, FailurePolicy
from elastrain.executor._private.elastic.driver.pool import BundleDiscovery, Phase, PoolWorker, WorkerPool
from elastrain.executor._private.elastic.driver.spares import Spares
from elastrain.executor._private.elastic.options import ElasticOptions
from elastrain.executor._private.elastic.world import World, make_world
from elastrain.executor._private.errors import ElasticJobError, first_line, worker_actor_died, worker_error
from elastrain.executor._private.observers import RunWatch, exception_line, worker_record
from elastrain.executor._private.options import ExecutorOptions

logger = logging.getLogger("elastrain.executor")

__all__ = ["ElasticDriver", "ElasticJobError", "ElasticStats"]

_POLL_S = 0.05
# How often the driver asks the rendezvous actor for failures, silent workers and arrivals (its lease, too).
# A reported failure wakes it at once (a pending ``failure_reported`` call, renewed every _FAILURE_WATCH_S).
_COORDINATOR_POLL_S = 0.1
_FAILURE_WATCH_S = 5.0
# How long a member may take to answer the roll call after its group failed (its control thread answers in
# milliseconds; a worker lost with its node never does): _ROLL_CALL_FACTOR times as long as the slowest member
# that reported the failure took to answer the same call, within these bounds.
_ROLL_CALL_S = 0.3
_ROLL_CALL_MIN_S = 0.1
_ROLL_CALL_FACTOR = 10.0
# The actor concurrency group the roll call is answered in.
CONTROL_GROUP = "control"


@dataclass
class _Finish:
    generation: int  # 0: the function never joined a group (it is not under elastic.run)
    rank: int
    value: Any
    spawned_at: float
    worker_id: str


@dataclass
class ElasticStats:
    resets: int = 0
    worlds: list[int] = field(default_factory=list)  # world size of each published world
    spares_used: int = 0  # spare workers that joined on a host Ray placed them on
    evictions: int = 0  # workers stopped because they stopped answering or never arrived


class ElasticDriver:
    """Runs one elastic call: ``run()`` returns the results of the workers that finished, ordered by rank."""

    def __init__(
        self,
        *,
        options: ExecutorOptions,
        manager: HostManager,
        coordinator: Any,
        sink: Any,
        worker_class: Any,
        elastic_options: ElasticOptions,
        startup_grace_s: float = 30.0,
        spare_worker: bool = False,
        watch: RunWatch | None = None,
        bundles: BundleDiscovery | None = None,
    ) -> None:
        self.options = options
        self.manager = manager
        self.coordinator = coordinator
        self.sink = sink
        self.elastic_options = elastic_options
        self.stats = ElasticStats()
        self.pool = WorkerPool(options, worker_class, bundles)
        self.policy = FailurePolicy(
            options,
            manager,
            startup_grace_s=startup_grace_s,
            arrival_timeout_s=elastic_options.collective_timeout_s,
        )
        self.spare_worker = spare_worker
        self.spares = Spares(options, manager, self.pool, self.policy, self.stats)
        self.watch = watch or RunWatch([])
        self._records: dict[str, dict[str, Any]] = {}  # what observers know of the current world's members
        self._generation = 0
        self._world: World | None = None
        self._world_complete = True  # every member of the current world arrived
        self._after_failure = False  # the current world was formed because a group failed
        self._members_by_generation: dict[int, set[str]] = {}
        self._finishing: int | None = None  # the generation in which the first worker finished
        self._next_coordinator_poll = 0.0
        self._failure_watch: Any = None  # a pending coordinator.failure_reported call
        self._host_events: queue.SimpleQueue[list[HostEvent]] = queue.SimpleQueue()
        self._stop_reason: str | None = None
        self._stopped = threading.Event()
        self._ended = threading.Event()

    # -- the call --------------------------------------------------------------------------------------------

    def stop(self, reason: str) -> None:
        """End the call from another thread: ``run`` stops every worker and raises ``ElasticJobError``."""
        self._stop_reason = reason
        self._stopped.set()

    def run(self, payload: Any, call_id: int) -> list[Any]:
        import ray

        remove_listener = self.manager.add_listener(self._host_events.put)
        try:
            self._wait_for_first_slots()
            self._fill()
            return self._supervise(ray, payload, call_id)
        except AllHostsBlacklistedError as error:
            raise ElasticJobError(f"The elastic job cannot go on: {error}") from error
        except ray.exceptions.GetTimeoutError as error:
            raise ElasticJobError(
                f"The elastic job's rendezvous actor did not answer within {CONTROL_TIMEOUT_S:g} s; is the node "
                "that hosts it overloaded or gone?"
            ) from error
        except Exception as error:
            if self._stopped.is_set() and not isinstance(error, ElasticJobError):
                # Stopping tears down the rendezvous too; whatever that broke mid-step, the cause is the stop.
                raise ElasticJobError(f"The elastic job was stopped: {self._stop_reason}.") from error
            raise
        finally:
            remove_listener()
            self.pool.stop_all()
            self._ended.set()

    def wait_ended(self, timeout_s: float) -> bool:
        """Wait until ``run`` has stopped its workers and returned (after :meth:`stop`); whether it has."""
        return self._ended.wait(timeout_s)

    def _wait_for_first_slots(self) -> None:
        deadline = time.monotonic() + self.options.elastic_timeout
        while True:
            remaining = deadline - time.monotonic()
            try:
                self.manager.wait_for_slots(self.options.num_workers, max(min(remaining, WAITING_NOTICE_S), 0.01))
                return
            except HostManagerStoppedError:
                reason = self._stop_reason or "its host manager was stopped"
                raise ElasticJobError(f"The elastic job was stopped before it started: {reason}.") from None
            except TimeoutError as error:
                if time.monotonic() >= deadline:
                    raise ElasticJobError(f"The elastic job could not start: {error}") from None
                logger.info(
                    "Waiting for hosts with min_workers=%s slots (%s); giving up in %.0f s.",
                    self.options.num_workers,
                    self.policy.describe(self.pool),
                    deadline - time.monotonic(),
                )

    def _supervise(self, ray: Any, payload: Any, call_id: int) -> list[Any]:
        finished: list[_Finish] = []
        while True:
            if self._stopped.is_set():
                raise ElasticJobError(f"The elastic job was stopped: {self._stop_reason}.")
            refs = {w.prepare_ref: w for w in self.pool if w.node is None}
            refs.update({w.run_ref: w for w in self.pool if w.run_ref is not None})
            ready = self._wait_for_events(ray, list(refs))
            gained = lost = False
            for ref in ready:
                worker = refs[ref]
                if ref is worker.prepare_ref and worker.node is None:
                    gained |= self._on_prepared(ray, worker, payload, call_id)
                else:
                    result, died = self._on_finished(ray, worker)
                    if result is not None:
                        finished.append(result)
                    lost |= died
            failed, evicted = self._poll_coordinator(ray)
            if finished:
                done = self._finished_results(finished)
                if done is not None:
                    return done
                continue
            changed = self._apply_host_events() or self._hand_off_done()
            self._stop_slow_starts()
            self.policy.check_minimum(self.pool)
            self._fill()
            broken = lost or failed or evicted
            # A loss is published at once (survivors are waiting); workers that are still starting get a moment
            # more, so that several newcomers join in one reset rather than one reset each.
            if broken or changed or ((gained or self._unpublished_ready()) and not self._starting_recently()):
                self._publish(force=failed, after_failure=broken)

    def _wait_for_events(self, ray: Any, refs: list[Any]) -> list[Any]:
        """Up to _POLL_S for a worker's call to end or a failure to be reported; the worker calls that ended.
        A reported failure makes the coordinator's next poll happen now."""
        if self._failure_watch is None:
            self._failure_watch = self.coordinator.failure_reported.remote(_FAILURE_WATCH_S)
        watched = [*refs, self._failure_watch]
        ready = ray.wait(watched, num_returns=1, timeout=_POLL_S)[0]
        if ready:
            ready = ray.wait(watched, num_returns=len(watched), timeout=0)[0]
        if self._failure_watch in ready:
            self._failure_watch = None
            self._next_coordinator_poll = 0.0
        waited = set(refs)
        return [ref for ref in ready if ref in waited]

    def _finished_results(self, finished: list[_Finish]) -> list[Any] | None:
        """Once a worker finished in generation g, nothing new starts, and the call ends when every member of g
        has finished or is gone; its result is theirs, by rank."""
        generation = finished[0].generation
        if generation == 0:
            # A plain function joins no group: each worker that starts runs it once, and the call ends when
            # none is left running or starting. No ranks, so results come in the order workers were started.
            if any(w.counts for w in self.pool):
                return None
            return [f.value for f in sorted(finished, key=lambda f: f.spawned_at)]
        if self._finishing is None:
            self._finishing = generation
            logger.info(
                "Worker %s finished in group %s; waiting for that group's others.", finished[0].worker_id, generation
            )
        members = self._members_by_generation.get(generation, set())
        done = {f.worker_id for f in finished if f.generation == generation}
        if any(w.worker_id in members - done and w.phase is not Phase.STOPPING for w in self.pool):
            return None
        missing = members - done
        if missing:
            logger.warning(
                "Worker(s) %s of group %s ended without a result after the others finished; returning %s result(s).",
                ", ".join(sorted(missing)),
                generation,
                len(done),
            )
        ordered = sorted((f for f in finished if f.generation == generation), key=lambda f: f.rank)
        return [f.value for f in ordered]

    # -- workers ---------------------------------------------------------------------------------------------

    def _fill(self) -> None:
        """Start workers on free slots, up to max_workers."""
        if self._finishing is not None:
            return
        hosts = self.manager.current_hosts
        limit = self.options.max_workers or sum(h.slots for h in hosts.values())
        per_host: dict[str, int] = {}
        for worker in self.pool.in_phase(Phase.STARTING, Phase.READY, Phase.MEMBER, Phase.LEAVING):
            per_host[worker.host_id] = per_host.get(worker.host_id, 0) + 1  # a leaving worker holds its slot
        count = len(self.pool.counted())
        for host_id, host in hosts.items():
            while count < limit and per_host.get(host_id, 0) < host.slots:
                self.pool.spawn(host_id)
                per_host[host_id] = per_host.get(host_id, 0) + 1
                count += 1
        if self.spare_worker:
            self.spares.keep_one(count)

    def _on_prepared(self, ray: Any, worker: PoolWorker, payload: Any, call_id: int) -> bool:
        try:
            worker.node = ray.get(worker.prepare_ref)
        except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError) as error:
            if worker.phase is not Phase.STOPPING:
                self.policy.worker_died(worker, f"failed to start: {first_line(error)}")
            self.pool.forget(worker)
            return False
        if worker.phase is Phase.STOPPING or self._finishing is not None:
            if worker.phase is not Phase.STOPPING:
                self.pool.stop(worker)
            self.pool.forget(worker)
            return False
        if worker.phase is Phase.SPARE and not self.spares.adopt(worker, worker.node.node_id):
            return False
        self.pool.ready_to_kill_on(worker.node)
        worker.run_ref = worker.actor.run_elastic.remote(
            payload, call_id, worker.worker_id, self.coordinator, self.elastic_options, self.sink
        )
        worker.phase = Phase.READY
        return True

    def _on_finished(self, ray: Any, worker: PoolWorker) -> tuple[_Finish | None, bool]:
        """The worker's call ended: its result, and whether it died unexpectedly."""
        ref, worker.run_ref = worker.run_ref, None
        try:
            outcome = ray.get(ref)
        except ray.exceptions.RayActorError as error:
            if not worker_actor_died(error):  # its task failed on another actor's death (say, the rendezvous)
                ray.kill(worker.actor, no_restart=True)
            died = worker.phase not in (Phase.STOPPING, Phase.LEAVING)
            if died:
                self.policy.worker_died(worker, first_line(error))
                self._exited(worker, "CRASHED", first_line(error))
            self.pool.forget(worker)
            return None, died
        except (ray.exceptions.RayTaskError, ray.exceptions.UnserializableException) as error:
            # from None: the message holds the worker's traceback; its cause is the error's `cause`.
            node_id = worker.node.node_id if worker.node else None
            failure = worker_error(self._rank_of(worker), node_id, error)
            self._exited(worker, "CRASHED", exception_line(failure.remote_traceback))
            raise failure from None
        self.pool.forget(worker)
        if outcome is None:  # left out of the next world: stopped without a result
            return None, False
        generation, rank, value = outcome
        return _Finish(generation, rank, value, worker.spawned_at, worker.worker_id), False

    def _stop_slow_starts(self) -> None:
        for worker in self.policy.slow_starts(self.pool):
            self.policy.worker_died(worker, f"did not start within {self.policy.startup_grace_s} s")
            self.pool.stop(worker)

    def _evict(self, worker: PoolWorker, reason: str) -> None:
        """Stop a worker that is alive to Ray but not to the job; its peers' collectives fail once it is gone."""
        logger.warning("Evicting worker %s on host %s: %s.", worker.worker_id, worker.host_id, reason)
        self.policy.worker_died(worker, reason)
        self._exited(worker, "CRASHED", f"evicted: {reason}")
        self.pool.stop(worker, unresponsive=True)
        self.stats.evictions += 1

    # -- hosts -----------------------------------------------------------------------------------------------

    def _apply_host_events(self) -> bool:
        changed = False
        while not self._host_events.empty():
            for event in self._host_events.get():
                if event.change is HostChange.REMOVED or (
                    event.change is HostChange.SLOTS_CHANGED and event.new_slots < event.old_slots
                ):
                    changed |= self._shrink_host(event.host_id, event.new_slots)
        return changed

    def _shrink_host(self, host_id: str, slots: int) -> bool:
        """Members beyond the host's slots leave at their next commit (no rollback); others stop now."""
        on_host = [w for w in self.pool.counted() if w.host_id == host_id]
        extra = on_host[slots:] if slots else on_host
        for worker in reversed(extra):
            if worker.phase is Phase.MEMBER:
                worker.phase = Phase.LEAVING
                logger.info("Worker %s leaves at its next commit: host %s went away.", worker.worker_id, host_id)
                self._exited(worker, "REMOVED", f"its host {host_id} went away")
            else:
                self.pool.stop(worker)
                logger.info("Stopping worker %s: host %s went away.", worker.worker_id, host_id)
        return bool(extra)

    # -- the rendezvous --------------------------------------------------------------------------------------

    def _poll_coordinator(self, ray: Any) -> tuple[bool, bool]:
        """Act on what the rendezvous actor saw (a few times a second): whether the current group failed without a
        death, and whether a worker was evicted."""
        now = time.monotonic()
        if now < self._next_coordinator_poll:
            return False, False
        self._next_coordinator_poll = now + _COORDINATOR_POLL_S
        report = ray.get(
            self.coordinator.poll.remote(self.elastic_options.liveness_timeout_s), timeout=CONTROL_TIMEOUT_S
        )
        gone = [worker_id for worker_id in report.silent if self.pool.get(worker_id) is None]
        if gone:
            self.coordinator.forget.remote(gone)
        if self._world is not None:
            self._world_complete = report.missing is None or report.missing[0] != self._world.generation
        evictions = self.policy.silent(report, self.pool) + self.policy.never_arrived(
            report, self.pool, self._after_failure
        )
        for worker, reason in evictions:
            self._evict(worker, reason)
        current = [r for r in report.failures if self._world is not None and r[1] == self._world.generation]
        if current and self._finishing is not None:
            # The group failed after a member finished: no new group forms; those still in it end without a result.
            for worker_id, _, reason in current:
                failed_worker = self.pool.get(worker_id)
                if failed_worker is not None and failed_worker.phase is not Phase.STOPPING:
                    logger.warning(
                        "Stopping worker %s: its group failed after another member finished (%s).", worker_id, reason
                    )
                    self.pool.stop(failed_worker, unresponsive=True)
            return False, False
        if current:
            death_on_its_way, gone, waited_s = self._roll_call(ray, {worker_id for worker_id, _, _ in current})
            if death_on_its_way:
                return False, bool(evictions)  # the next round forms the group without the dead worker, once
            for worker in gone:
                self._lost(worker, f"did not answer within {waited_s:.2f} s after its group failed (its node lost?)")
        if current:
            logger.warning("Group %s failed (%s); forming a new one.", self._world.generation, current[0][2])  # type: ignore[union-attr]
        return bool(current), bool(evictions)

    def _roll_call(self, ray: Any, reporters: set[str]) -> tuple[bool, list[PoolWorker], float]:
        """After members reported their group failed: ``(death_on_its_way, gone, seconds waited)``.

        Survivors often report a failed collective before Ray tells the driver that a peer died; re-forming the
        same members would then cost a reset and a rendezvous with a dead worker. A worker that exited is known
        to Ray at once (its call ends): ``death_on_its_way``. A worker lost with its node is known to Ray only
        seconds later, so every member is asked whether it lives (its actor's control thread answers even
        mid-collective). The reporters' answers tell how long a live member takes right now; the others that do
        not answer within _ROLL_CALL_FACTOR times that (bounded by _ROLL_CALL_MIN_S and _ROLL_CALL_S) are
        ``gone``.
        """
        members = self.pool.in_phase(Phase.MEMBER)
        calls = {w.run_ref: w for w in members if w.run_ref is not None}
        if all(w.worker_id in reporters for w in members):
            return False, [], 0.0
        asked_at = time.monotonic()
        pings = {w.actor.alive.options(concurrency_group=CONTROL_GROUP).remote(): w for w in members}
        deadline = asked_at + _ROLL_CALL_S
        answered: set[str] = set()
        while True:
            waiting = [ref for ref in pings if pings[ref].worker_id not in answered]
            if all(pings[ref].worker_id in reporters for ref in waiting):
                return False, [], 0.0
            ready = ray.wait(list(calls) + waiting, num_returns=1, timeout=max(0.0, deadline - time.monotonic()))[0]
            if not ready:
                gone = [pings[ref] for ref in waiting if pings[ref].worker_id not in reporters]
                return False, gone, time.monotonic() - asked_at
            if ready[0] in calls:
                return True, [], 0.0
            try:
                ray.get(ready[0])
            except ray.exceptions.RayActorError:
                return True, [], 0.0  # Ray knows it is dead: its call ends too
            worker_id = pings[ready[0]].worker_id
            answered.add(worker_id)
            if worker_id in reporters:
                took = time.monotonic() - asked_at
                deadline = min(deadline, asked_at + max(_ROLL_CALL_MIN_S, _ROLL_CALL_FACTOR * took))

    def _lost(self, worker: PoolWorker, reason: str) -> None:
        """A member that is dead to the job although Ray does not know yet: counted as a death, not an eviction."""
        logger.warning("Worker %s on host %s is gone: %s.", worker.worker_id, worker.host_id, reason)
        self.policy.worker_died(worker, reason)
        self._exited(worker, "CRASHED", reason)
        self.pool.stop(worker, unresponsive=True)

    def _publish(self, force: bool = False, after_failure: bool = False) -> None:
        """Publish the running workers as a new group (``force``: even when they are the current group's)."""
        import ray

        if self._finishing is not None:
            return
        ready = [w for w in self.pool.in_phase(Phase.READY, Phase.MEMBER) if w.run_ref is not None]
        if not any(w.phase is Phase.MEMBER for w in ready):
            # Without them no member would hold the committed state: leaving members stay for one more group,
            # whose sync hands their state to the newcomers, and leave after it.
            ready += self._leaving_members()
        if len(ready) < self.options.num_workers:
            return  # survivors wait in join until enough workers are up (bounded by elastic_timeout)
        same = self._world is not None and {m.worker_id for m in self._world.members} == {w.worker_id for w in ready}
        if same and not force:
            return
        if self._world is not None:
            self.stats.resets += 1
            if self.options.reset_limit is not None and self.stats.resets > self.options.reset_limit:
                raise ElasticJobError(
                    f"The elastic job needed reset {self.stats.resets}, beyond reset_limit="
                    f"{self.options.reset_limit}; raise reset_limit or fix what keeps failing."
                )
        # Members of a world formed after a failure must come promptly; that stays so while they have not all come.
        self._after_failure = after_failure or (self._after_failure and not self._world_complete)
        self._world_complete = False
        self._generation += 1
        self._world = make_world(self._generation, ready, list(self.manager.current_hosts))
        self._members_by_generation[self._generation] = {m.worker_id for m in self._world.members}
        for worker in ready:
            if worker.phase is Phase.READY:
                worker.phase = Phase.MEMBER
        self.stats.worlds.append(self._world.size)
        ray.get(self.coordinator.publish.remote(self._world), timeout=CONTROL_TIMEOUT_S)
        by_id = {w.worker_id: w for w in ready}
        self._records = {
            m.worker_id: worker_record(by_id[m.worker_id].actor, m.slot.rank, m.slot.local_rank, m.node_rank, node)
            for m in self._world.members
            if (node := by_id[m.worker_id].node) is not None
        }
        self.watch.workers_changed(list(self._records.values()), self._world.size, self.stats.resets)
        logger.info(
            "Published group %s: %s.",
            self._generation,
            ", ".join(f"{m.worker_id}@{m.slot.host_id}" for m in self._world.members),
        )

    # -- small helpers ---------------------------------------------------------------------------------------

    def _exited(self, worker: PoolWorker, status: str, detail: str) -> None:
        """Tell observers that a member of the current world crashed or was let go (once; others are no news)."""
        record = self._records.pop(worker.worker_id, None)
        if record is not None and self._finishing is None:
            self.watch.worker_exited(record, status, detail)

    def _leaving_members(self) -> list[PoolWorker]:
        world = self._world
        return [w for w in self.pool.in_phase(Phase.LEAVING) if world and world.member(w.worker_id) and w.run_ref]

    def _hand_off_done(self) -> bool:
        """Leaving workers stayed in the current world for its sync, which is over: they can go now."""
        if not self._world_complete or not self._leaving_members() or self._world is None:
            return False
        members = [self.pool.get(m.worker_id) for m in self._world.members]
        return any(w is not None and w.phase is Phase.MEMBER for w in members)

    def _unpublished_ready(self) -> bool:
        return bool(self.pool.in_phase(Phase.READY))

    def _starting_recently(self) -> bool:
        """Some worker is still starting, and not for longer than the start-up grace."""
        now = time.monotonic()
        return any(now - w.spawned_at < self.policy.startup_grace_s for w in self.pool.in_phase(Phase.STARTING))

    def actors(self) -> dict[str, Any]:
        """The running workers' actor handles by worker id (for tools and fault-injection tests)."""
        return {w.worker_id: w.actor for w in self.pool.in_phase(Phase.READY, Phase.MEMBER) if w.run_ref is not None}

    def _rank_of(self, worker: PoolWorker) -> int:
        member = self._world.member(worker.worker_id) if self._world else None
        return member.slot.rank if member else -1
