"""The Ray shell around the driver's core: it gathers events from Ray, discovery and the rendezvous actor, hands
them to ``DriverCore.step``, and carries out the actions that come back. Every decision is the core's; what is
here is waiting, asking and doing."""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any

from elastrain.discovery import AllHostsBlacklistedError, HostChange, HostEvent, HostManager, HostManagerStoppedError
from elastrain.executor._private.elastic.coordinator import CONTROL_TIMEOUT_S
from elastrain.executor._private.elastic.driver import events as ev
from elastrain.executor._private.elastic.driver.config import CoreConfig, ElasticStats
from elastrain.executor._private.elastic.driver.core import DriverCore
from elastrain.executor._private.elastic.driver.lifecycle import WorkerPhase, strict_from_environment
from elastrain.executor._private.elastic.driver.policy import WAITING_NOTICE_S, describe
from elastrain.executor._private.elastic.driver.pool import BundleDiscovery, NoBundleError, WorkerHandle, WorkerPool
from elastrain.executor._private.elastic.options import ElasticOptions
from elastrain.executor._private.errors import (
    ElasticJobError,
    first_line,
    unserializable_types,
    worker_actor_died,
    worker_error,
)
from elastrain.executor._private.observers import RunWatch, exception_line, worker_record
from elastrain.executor._private.options import ExecutorOptions
from elastrain.executor._private.versions import mismatch, running_versions

logger = logging.getLogger("elastrain.executor")

__all__ = ["CONTROL_GROUP", "ElasticDriver", "ElasticJobError", "ElasticStats"]

_POLL_S = 0.05
# How often the shell asks the rendezvous actor for failures, silent workers and arrivals (its lease, too).
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
        pool: WorkerPool | None = None,
    ) -> None:
        """``pool``: where the workers run; by default one Ray actor each, of ``worker_class``."""
        self.options = options
        self.manager = manager
        self.coordinator = coordinator
        self.sink = sink
        self.elastic_options = elastic_options
        self.core = DriverCore(
            CoreConfig(
                min_workers=options.num_workers,
                max_workers=options.max_workers,
                reset_limit=options.reset_limit,
                elastic_timeout=options.elastic_timeout,
                startup_grace_s=startup_grace_s,
                arrival_timeout_s=elastic_options.collective_timeout_s,
                spare_worker=spare_worker,
                size_multiple=options.size_multiple,
            ),
            strict=strict_from_environment(),
        )
        self.stats: ElasticStats = self.core.stats
        self.pool = pool or WorkerPool(options, worker_class, bundles)
        self.watch = watch or RunWatch([])
        self._records: dict[str, dict[str, Any]] = {}  # what observers know of the current world's members
        self._next_coordinator_poll = 0.0
        self._failure_watch: Any = None  # a pending coordinator.failure_reported call
        self._host_events: queue.SimpleQueue[list[HostEvent]] = queue.SimpleQueue()
        self._payload: tuple[Any, int] = (None, 0)
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

        self._payload = (payload, call_id)
        remove_listener = self.manager.add_listener(self._host_events.put)
        try:
            self._wait_for_first_slots()
            return self._supervise(ray)
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
                    describe(self.core.roster, self._hosts()),
                    deadline - time.monotonic(),
                )

    def _supervise(self, ray: Any) -> list[Any]:
        events: list[ev.Event] = [ev.HostsSeen(self._hosts())]
        while True:
            actions = self.core.step(time.monotonic(), events)
            while actions:
                action = actions.pop(0)
                if isinstance(action, ev.Finish):
                    return list(action.results)
                if isinstance(action, ev.Fail):
                    raise action.error
                if isinstance(action, ev.RollCall):
                    # The core waits for the answer before it decides anything else in this round.
                    answer = self._roll_call(ray, action)
                    actions += self.core.step(time.monotonic(), [answer])
                elif isinstance(action, ev.Spawn) and not self._spawn(action):
                    # Its host's bundles are gone (a lost node discovery has not dropped yet): a failed start.
                    self.manager.refresh()
                    failed = ev.PrepareFailed(action.worker_id, f"no bundle on host {action.host_id} any more")
                    actions += self.core.step(time.monotonic(), [ev.HostsSeen(self._hosts()), failed])
                else:
                    self._carry_out(ray, action)
            events = self._gather(ray)

    # -- events ----------------------------------------------------------------------------------------------

    def _gather(self, ray: Any) -> list[ev.Event]:
        """Wait up to _POLL_S for something to happen; what did, in the order the core should see it."""
        pending = {w.prepare_ref: w for w in self.pool if not w.prepared and w.prepare_ref is not None}
        pending.update({w.run_ref: w for w in self.pool if w.run_ref is not None})
        ready = self._wait_for_events(ray, list(pending))
        events: list[ev.Event] = []
        if self._stopped.is_set():
            events.append(ev.StopRequested(self._stop_reason or "stop() was called"))
        events.append(ev.HostsSeen(self._hosts()))
        for ref in ready:
            worker = pending[ref]
            if ref is worker.prepare_ref and not worker.prepared:
                events += self._prepared(ray, worker)
            else:
                events.append(self._run_ended(ray, worker))
        report = self._poll_coordinator(ray)
        if report is not None:
            events.append(ev.Polled(report))
        while not self._host_events.empty():
            for change in self._host_events.get():
                if change.change is HostChange.REMOVED or (
                    change.change is HostChange.SLOTS_CHANGED and change.new_slots < change.old_slots
                ):
                    events.append(ev.HostShrunk(change.host_id, change.new_slots))
        return events

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

    def _prepared(self, ray: Any, worker: WorkerHandle) -> list[ev.Event]:
        try:
            node = ray.get(worker.prepare_ref)
        except ray.exceptions.RayError as error:  # it died starting, or cannot be placed (its node is gone)
            worker.prepare_ref = None
            return [ev.PrepareFailed(worker.worker_id, first_line(error))]
        worker.node = node
        where = f"worker {worker.worker_id} on {node.node_ip} (pid {node.pid})"
        problem = mismatch(running_versions(), node.versions, where)
        if problem:
            self.pool.stop(worker)
            return [ev.PrepareFailed(worker.worker_id, problem, incompatible=True)]
        record = self.core.roster.get(worker.worker_id)
        if record is not None and record.phase is WorkerPhase.SPARE:
            if node.node_id not in self.manager.current_hosts:
                self.manager.refresh()  # Ray saw the node before discovery's next poll
            worker.host_id = node.node_id
            return [ev.HostsSeen(self._hosts()), ev.Prepared(worker.worker_id, node.node_id)]
        return [ev.Prepared(worker.worker_id, node.node_id)]

    def _run_ended(self, ray: Any, worker: WorkerHandle) -> ev.Event:
        ref, worker.run_ref = worker.run_ref, None
        try:
            outcome = ray.get(ref)
        except ray.exceptions.RayActorError as error:
            if not worker_actor_died(error):  # its task failed on another actor's death (say, the rendezvous)
                self.pool.kill(worker)
            node_lost = worker.node is not None and not self.pool.node_alive(worker.node.node_id)
            return ev.Died(worker.worker_id, first_line(error), node_lost)
        except (ray.exceptions.RayTaskError, *unserializable_types()) as error:
            node_id = worker.node.node_id if worker.node else None
            raised = worker_error(self.core.rank_of(worker.worker_id), node_id, error)
            failure: Exception = raised
            if isinstance(raised.cause, ElasticJobError):
                failure = ElasticJobError(str(raised.cause))  # the workers' own verdict on the job: say it as is
            return ev.Raised(worker.worker_id, failure, exception_line(raised.remote_traceback))
        if outcome is None:  # left out of the next world: stopped without a result
            return ev.Removed(worker.worker_id)
        generation, rank, value = outcome
        return ev.Finished(worker.worker_id, generation, rank, value)

    def _poll_coordinator(self, ray: Any) -> Any:
        """What the rendezvous actor saw, a few times a second (sooner after a reported failure); None between."""
        now = time.monotonic()
        if now < self._next_coordinator_poll:
            return None
        self._next_coordinator_poll = now + _COORDINATOR_POLL_S
        return ray.get(self.coordinator.poll.remote(self.elastic_options.liveness_timeout_s), timeout=CONTROL_TIMEOUT_S)

    def _hosts(self) -> ev.Hosts:
        current = self.manager.current_hosts
        return ev.Hosts({h: info.slots for h, info in current.items()}, frozenset(self.manager.blacklisted_hosts()))

    # -- actions ---------------------------------------------------------------------------------------------

    def _carry_out(self, ray: Any, action: ev.Action) -> None:
        if isinstance(action, ev.StartRun):
            self._start_run(action.worker_id)
        elif isinstance(action, ev.Stop):
            worker = self.pool.get(action.worker_id)
            if worker is not None:
                self.pool.stop(worker, unresponsive=action.unresponsive)
        elif isinstance(action, ev.Forget):
            worker = self.pool.get(action.worker_id)
            if worker is not None:
                self.pool.forget(worker)
        elif isinstance(action, ev.WorkerFailed):
            worker = self.pool.get(action.worker_id)
            node = worker.node if worker is not None else None
            if action.check_node and node is not None and not self.pool.node_alive(node.node_id):
                self.manager.blacklist(action.host_id)
        elif isinstance(action, ev.Blacklist):
            self.manager.blacklist(action.host_id)
        elif isinstance(action, ev.Publish):
            self._publish(ray, action)
        elif isinstance(action, ev.ForgetBeats):
            self.coordinator.forget.remote(list(action.worker_ids))
        elif isinstance(action, ev.Exited):
            record = self._records.pop(action.worker_id, None)
            if record is not None:
                self.watch.worker_exited(record, action.status, action.detail)
        elif isinstance(action, ev.RunEvent):
            logger.warning("Run event %s: %s", action.kind, dict(action.fields))
            self.watch.event(action.kind, dict(action.fields))

    def _spawn(self, action: ev.Spawn) -> bool:
        try:
            self.pool.spawn(action.worker_id, action.host_id)
        except NoBundleError:
            return False
        return True

    def _start_run(self, worker_id: str) -> None:
        worker = self.pool.get(worker_id)
        if worker is None or worker.node is None:
            return
        self.pool.ready_to_kill_on(worker.node)
        payload, call_id = self._payload
        worker.run_ref = worker.actor.run_elastic.remote(
            payload, call_id, worker.worker_id, self.coordinator, self.elastic_options, self.sink
        )

    def _publish(self, ray: Any, action: ev.Publish) -> None:
        world = action.world
        ray.get(self.coordinator.publish.remote(world), timeout=CONTROL_TIMEOUT_S)
        self._records = {}
        for member in world.members:
            worker = self.pool.get(member.worker_id)
            if worker is not None and worker.node is not None:
                self._records[member.worker_id] = worker_record(
                    worker.actor, member.slot.rank, member.slot.local_rank, member.node_rank, worker.node
                )
        self.watch.workers_changed(list(self._records.values()), world.size, action.resets)

    def _roll_call(self, ray: Any, action: ev.RollCall) -> ev.RollCallDone:
        """After members reported their group failed, ask every member whether it lives.

        Survivors often report a failed collective before Ray tells the driver that a peer died; re-forming the
        same members would then cost a reset and a rendezvous with a dead worker. A worker that exited is known
        to Ray at once (its call ends): ``death_on_its_way``. A worker lost with its node is known to Ray only
        seconds later, so every member is asked whether it lives (its actor's control thread answers even
        mid-collective). The reporters' answers tell how long a live member takes right now; the others that do
        not answer within _ROLL_CALL_FACTOR times that (bounded by _ROLL_CALL_MIN_S and _ROLL_CALL_S) are
        ``gone``.
        """
        reporters = action.reporters
        members = [w for w in (self.pool.get(i) for i in action.members) if w is not None]
        calls = {w.run_ref: w for w in members if w.run_ref is not None}
        asked_at = time.monotonic()
        pings = {w.actor.alive.options(concurrency_group=CONTROL_GROUP).remote(): w for w in members}
        deadline = asked_at + _ROLL_CALL_S
        answered: set[str] = set()
        while True:
            waiting = [ref for ref in pings if pings[ref].worker_id not in answered]
            if all(pings[ref].worker_id in reporters for ref in waiting):
                return ev.RollCallDone(death_on_its_way=False)
            ready = ray.wait(list(calls) + waiting, num_returns=1, timeout=max(0.0, deadline - time.monotonic()))[0]
            if not ready:
                gone = tuple(pings[ref].worker_id for ref in waiting if pings[ref].worker_id not in reporters)
                return ev.RollCallDone(False, gone, time.monotonic() - asked_at)
            if ready[0] in calls:
                return ev.RollCallDone(death_on_its_way=True)
            try:
                ray.get(ready[0])
            except ray.exceptions.RayActorError:
                return ev.RollCallDone(death_on_its_way=True)  # Ray knows it is dead: its call ends too
            worker_id = pings[ready[0]].worker_id
            answered.add(worker_id)
            if worker_id in reporters:
                took = time.monotonic() - asked_at
                deadline = min(deadline, asked_at + max(_ROLL_CALL_MIN_S, _ROLL_CALL_FACTOR * took))

    # -- for tools and tests ---------------------------------------------------------------------------------

    def actors(self) -> dict[str, Any]:
        """The running workers' actor handles by worker id (for tools and fault-injection tests)."""
        running = (WorkerPhase.READY, WorkerPhase.MEMBER)
        return {
            w.worker_id: w.actor
            for w in self.pool
            if w.run_ref is not None and (r := self.core.roster.get(w.worker_id)) is not None and r.phase in running
        }
