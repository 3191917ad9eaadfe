"""The driver of an elastic job: keeps workers on the hosts discovery reports, forms worlds, never restarts
survivors.

Workers that crash are replaced; survivors roll back to their last commit and go on in a smaller world at
once, and replacements or workers on new hosts join at the survivors' next commit, once they are up (a new
actor costs seconds; the survivors don't wait for it).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from elastrain.discovery import HostChange, HostEvent, HostManager, HostManagerStoppedError
from elastrain.executor._private.elastic.runtime import ElasticOptions
from elastrain.executor._private.elastic.world import World, make_world
from elastrain.executor._private.errors import ExecutorError, WorkerError, worker_actor_died
from elastrain.executor._private.observers import RunWatch, worker_record
from elastrain.executor._private.options import ExecutorOptions
from elastrain.executor._private.placement import NodeInfo, node_alive, pin_to_host

logger = logging.getLogger("elastrain.executor")

_POLL_S = 0.05
# Workers that die before they ever joined a group, this many times in a row on one host, mark the host bad.
_STARTUP_FAILURES_BEFORE_BLACKLIST = 3
# How often the driver reads the failures workers report.
_FAILURE_POLL_S = 0.25
# After a spare worker died or landed where it could not be used, no new spare for this long, doubling with
# every further miss (a broken or blacklisted node with room would otherwise catch spare after spare).
_SPARE_COOLDOWN_S = 30.0
_SPARE_COOLDOWN_MAX_S = 600.0


class ElasticJobError(ExecutorError):
    """An elastic job could not go on: too few workers for too long, too many resets, or a worker raised."""


@dataclass
class _Worker:
    worker_id: str
    host_id: str
    actor: Any
    prepare_ref: Any
    node: NodeInfo | None = None
    run_ref: Any = None
    joined: bool = False  # has been a member of a published world (so it holds committed state)
    spawned_at: float = field(default_factory=time.monotonic)
    stopping: bool = False  # the driver is stopping it on purpose (host removed, job ending)
    spare: bool = False  # started without a host, for Ray to place the moment resources appear


@dataclass
class _Finish:
    generation: int  # 0: the function never joined a group (it is not under elastic.run)
    rank: int
    value: Any
    spawned_at: float


@dataclass
class ElasticStats:
    resets: int = 0
    worlds: list[int] = field(default_factory=list)  # world size of each published world
    spares_used: int = 0  # spare workers that joined on a host Ray placed them on


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
    ) -> None:
        self.options = options
        self.startup_grace_s = startup_grace_s
        self.manager = manager
        self.coordinator = coordinator
        self.sink = sink
        self.worker_class = worker_class
        self.elastic_options = elastic_options
        self.stats = ElasticStats()
        self._ids = itertools.count()
        self._workers: dict[str, _Worker] = {}
        self._retired: list[Any] = []  # handles of workers no longer tracked, killed when the call ends
        self._generation = 0
        self._world: World | None = None
        self._members_by_generation: dict[int, set[str]] = {}
        self._next_failure_poll = 0.0
        self._host_events: queue.SimpleQueue[list[HostEvent]] = queue.SimpleQueue()
        self._startup_failures: dict[str, int] = {}
        self._below_min_since: float | None = None
        self._stop_reason: str | None = None
        self._stopped = threading.Event()
        self._ended = threading.Event()
        self.spare_worker = spare_worker
        self.watch = watch or RunWatch([])
        self._no_spare_until = 0.0
        self._spare_misses = 0

    # -- the call --------------------------------------------------------------------------------------------

    def stop(self, reason: str) -> None:
        """End the call from another thread: ``run`` stops every worker and raises ``ElasticJobError``."""
        self._stop_reason = reason
        self._stopped.set()

    def run(self, payload: Any, call_id: int) -> list[Any]:
        import ray

        remove_listener = self.manager.add_listener(self._host_events.put)
        try:
            try:
                self.manager.wait_for_slots(self.options.num_workers, self.options.elastic_timeout)
            except HostManagerStoppedError:
                reason = self._stop_reason or "its host manager was stopped"
                raise ElasticJobError(f"The elastic job was stopped before it started: {reason}.") from None
            except TimeoutError as error:
                raise ElasticJobError(f"The elastic job could not start: {error}") from None
            self._fill()
            return self._supervise(ray, payload, call_id)
        except Exception as error:
            if self._stopped.is_set() and not isinstance(error, ElasticJobError):
                # Stopping tears down the rendezvous too; whatever that broke mid-step, the cause is the stop.
                raise ElasticJobError(f"The elastic job was stopped: {self._stop_reason}.") from error
            raise
        finally:
            remove_listener()
            self._stop_all(ray)
            self._ended.set()

    def wait_ended(self, timeout_s: float) -> bool:
        """Wait until ``run`` has stopped its workers and returned (after :meth:`stop`); whether it has."""
        return self._ended.wait(timeout_s)

    def _supervise(self, ray: Any, payload: Any, call_id: int) -> list[Any]:
        finished: list[_Finish] = []
        while True:
            if self._stopped.is_set():
                raise ElasticJobError(f"The elastic job was stopped: {self._stop_reason}.")
            refs = {w.prepare_ref: w for w in self._workers.values() if w.node is None}
            refs.update({w.run_ref: w for w in self._workers.values() if w.run_ref is not None})
            ready = ray.wait(list(refs), num_returns=len(refs), timeout=_POLL_S)[0] if refs else []
            gained = lost = False
            for ref in ready:
                worker = refs[ref]
                if ref is worker.prepare_ref and worker.node is None:
                    gained |= self._on_prepared(ray, worker, payload, call_id)
                else:
                    result = self._on_finished(ray, worker)
                    if result is not None:
                        finished.append(result)
                    lost = True
            if finished:
                done = self._finished_results(finished)
                if done is not None:
                    return done
                self._give_up_on_slow_starts()
                continue
            lost |= self._apply_host_events()
            self._give_up_on_slow_starts()
            force = self._group_failed_without_a_death(ray)
            self._check_minimum()
            self._fill()
            # A loss is published at once (survivors are waiting); workers that are still starting get a moment
            # more, so that several newcomers join in one reset rather than one reset each.
            if lost or force or ((gained or self._unpublished_ready()) and not self._starting_recently()):
                self._publish(force=force)

    def _finished_results(self, finished: list[_Finish]) -> list[Any] | None:
        """Once a worker finished, the members of its world finish too; newer joiners are let go."""
        generation = finished[0].generation
        if generation == 0:
            # A plain function joins no group: each worker that starts runs it once, and the call ends when
            # none is left running or starting. No ranks, so results come in the order workers were started.
            if any(not w.stopping and not w.spare for w in self._workers.values()):
                return None
            return [f.value for f in sorted(finished, key=lambda f: f.spawned_at)]
        members = {m.worker_id for m in self._world.members} if self._world else set()
        still_running = [
            w for w in self._workers.values() if w.run_ref is not None and w.worker_id in members and not w.stopping
        ]
        if still_running and self._world is not None and self._world.generation == generation:
            return None
        ordered = sorted((f for f in finished if f.generation == generation), key=lambda f: f.rank)
        return [f.value for f in ordered]

    # -- workers ---------------------------------------------------------------------------------------------

    def _fill(self) -> None:
        """Start workers on free slots, up to max_workers."""
        hosts = self.manager.current_hosts
        limit = self.options.max_workers or sum(h.slots for h in hosts.values())
        active = [w for w in self._workers.values() if not w.stopping and not w.spare]
        per_host: dict[str, int] = {}
        for worker in active:
            per_host[worker.host_id] = per_host.get(worker.host_id, 0) + 1
        count = len(active)
        for host_id, host in hosts.items():
            while count < limit and per_host.get(host_id, 0) < host.slots:
                self._spawn(host_id)
                per_host[host_id] = per_host.get(host_id, 0) + 1
                count += 1
        self._keep_a_spare(count)

    def _keep_a_spare(self, count: int) -> None:
        """Below max_workers with every known slot taken, keep one worker waiting without a host.

        Ray places it the moment a node with room registers, before discovery's next poll; it starts (and
        imports torch) while discovery catches up, and joins once its node is a usable host.
        """
        limit = self.options.max_workers
        if not self.spare_worker or limit is None or count >= limit or time.monotonic() < self._no_spare_until:
            return
        if any(w.spare and not w.stopping for w in self._workers.values()):
            return
        worker_id = f"w{next(self._ids)}"
        actor = self.worker_class.options(
            num_cpus=self.options.cpus_per_worker, num_gpus=self.options.gpus_per_worker, max_restarts=0
        ).remote()
        self._workers[worker_id] = _Worker(worker_id, "", actor, actor.prepare.remote(), spare=True)
        logger.debug("Keeping spare worker %s for a node that may join.", worker_id)

    def _adopt_spare(self, ray: Any, worker: _Worker, host_id: str) -> bool:
        """Give a spare that Ray placed on node ``host_id`` that host, if it is usable and has a free slot."""
        if host_id not in self.manager.current_hosts:
            self.manager.refresh()  # Ray saw the node before discovery's next poll
        host = self.manager.current_hosts.get(host_id)
        others = [w for w in self._workers.values() if not w.stopping and not w.spare]
        started_there = sum(1 for w in others if w.host_id == host_id and w.node is not None)
        started = sum(1 for w in others if w.node is not None)
        if (
            host is None
            or host_id in self.manager.blacklisted_hosts()
            or started_there >= host.slots
            or started >= (self.options.max_workers or 0)
        ):
            logger.info("Spare worker %s landed on %s, which it cannot use; stopping it.", worker.worker_id, host_id)
            worker.stopping = True
            ray.kill(worker.actor, no_restart=True)
            self._forget(worker)
            self._spare_missed()
            return False
        worker.spare, worker.host_id = False, host_id
        self._spare_misses = 0
        self.stats.spares_used += 1
        logger.info("Spare worker %s joins from new host %s.", worker.worker_id, host_id)
        self._drop_redundant_starts(ray, host_id, host.slots)
        return True

    def _spawn(self, host_id: str) -> None:
        worker_id = f"w{next(self._ids)}"
        actor = self.worker_class.options(
            num_cpus=self.options.cpus_per_worker,
            num_gpus=self.options.gpus_per_worker,
            max_restarts=0,
            **pin_to_host(host_id),
        ).remote()
        self._workers[worker_id] = _Worker(worker_id, host_id, actor, actor.prepare.remote())
        logger.info("Starting worker %s on host %s.", worker_id, host_id)

    def _spare_missed(self) -> None:
        cooldown = min(_SPARE_COOLDOWN_S * 2**self._spare_misses, _SPARE_COOLDOWN_MAX_S)
        self._spare_misses += 1
        self._no_spare_until = time.monotonic() + cooldown

    def _drop_redundant_starts(self, ray: Any, host_id: str, slots: int) -> None:
        """Workers still starting that an adopted spare made redundant: on its host, or beyond max_workers."""
        active = [w for w in self._workers.values() if not w.stopping and not w.spare]
        on_host = sum(1 for w in active if w.host_id == host_id)
        total, limit = len(active), self.options.max_workers or len(active)
        for worker in reversed(active):
            if worker.node is None and ((worker.host_id == host_id and on_host > slots) or total > limit):
                worker.stopping = True
                ray.kill(worker.actor, no_restart=True)
                total -= 1
                on_host -= worker.host_id == host_id

    def _on_prepared(self, ray: Any, worker: _Worker, payload: Any, call_id: int) -> bool:
        try:
            worker.node = ray.get(worker.prepare_ref)
        except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError) as error:
            if worker.stopping:
                self._forget(worker)
            else:
                self._on_died(worker, f"failed to start: {_first_line(error)}")
            return False
        if worker.stopping:
            self._forget(worker)
            return False
        if worker.spare and not self._adopt_spare(ray, worker, worker.node.node_id):
            return False
        worker.run_ref = worker.actor.run_elastic.remote(
            payload, call_id, worker.worker_id, self.coordinator, self.elastic_options, self.sink
        )
        return True

    def _on_finished(self, ray: Any, worker: _Worker) -> _Finish | None:
        ref, worker.run_ref = worker.run_ref, None
        try:
            outcome = ray.get(ref)
        except ray.exceptions.RayActorError as error:
            if not worker_actor_died(error):  # its task failed on another actor's death (say, the rendezvous)
                ray.kill(worker.actor, no_restart=True)
            if not worker.stopping:
                self._on_died(worker, _first_line(error))
            self._forget(worker)
            return None
        except ray.exceptions.RayTaskError as error:
            rank = self._rank_of(worker)
            cause = getattr(error, "cause", None)
            raise WorkerError(
                rank, worker.node.node_id if worker.node else None, getattr(error, "traceback_str", str(error)), cause
            ) from (cause if isinstance(cause, BaseException) else None)
        self._forget(worker)
        if outcome is None:  # left out of the next world: stopped without a result
            return None
        generation, rank, value = outcome
        return _Finish(generation, rank, value, worker.spawned_at)

    def _on_died(self, worker: _Worker, reason: str) -> None:
        self._forget(worker)
        if worker.spare:
            logger.info("Spare worker %s went away: %s", worker.worker_id, reason)
            self._spare_missed()
            return
        logger.warning("Worker %s on host %s died: %s", worker.worker_id, worker.host_id, reason)
        if worker.node is not None and not node_alive(worker.node.node_id):
            self.manager.blacklist(worker.host_id)
            return
        if not worker.joined:
            failures = self._startup_failures.get(worker.host_id, 0) + 1
            self._startup_failures[worker.host_id] = failures
            if failures >= _STARTUP_FAILURES_BEFORE_BLACKLIST:
                self.manager.blacklist(worker.host_id)
        else:
            self._startup_failures.pop(worker.host_id, None)

    def _forget(self, worker: _Worker) -> None:
        self._workers.pop(worker.worker_id, None)
        # Killed when the call ends even if its process still runs: a handle kept alive elsewhere (say, by an
        # error's traceback) must not keep an idle worker holding its CPUs.
        self._retired.append(worker.actor)

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
        import ray

        on_host = [w for w in self._workers.values() if w.host_id == host_id and not w.stopping]
        extra = on_host[slots:] if slots else on_host
        for worker in reversed(extra):
            worker.stopping = True
            ray.kill(worker.actor, no_restart=True)
            logger.info("Stopping worker %s: host %s went away.", worker.worker_id, host_id)
        return bool(extra)

    def _check_minimum(self) -> None:
        alive = sum(1 for w in self._workers.values() if not w.stopping and not w.spare)
        if alive >= self.options.num_workers:
            self._below_min_since = None
            return
        now = time.monotonic()
        if self._below_min_since is None:
            self._below_min_since = now
        elif now - self._below_min_since > self.options.elastic_timeout:
            raise ElasticJobError(
                f"The elastic job had fewer than min_workers={self.options.num_workers} workers for more than "
                f"elastic_timeout={self.options.elastic_timeout} s ({alive} alive; hosts: "
                f"{ {h: i.slots for h, i in self.manager.current_hosts.items()} }, blacklisted: "
                f"{sorted(self.manager.blacklisted_hosts())})."
            )

    # -- worlds ----------------------------------------------------------------------------------------------

    def _publish(self, force: bool = False) -> None:
        """Publish the ready workers as a new group (``force``: even when they are the current group's)."""
        import ray

        ready = [w for w in self._workers.values() if w.run_ref is not None and not w.stopping]
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
        self._generation += 1
        self._world = make_world(self._generation, ready, list(self.manager.current_hosts))
        self._members_by_generation[self._generation] = {m.worker_id for m in self._world.members}
        for worker in ready:
            worker.joined = True
        self.stats.worlds.append(self._world.size)
        ray.get(self.coordinator.publish.remote(self._world), timeout=30)
        by_id = {w.worker_id: w for w in ready}
        self.watch.workers_changed(
            [
                worker_record(by_id[m.worker_id].actor, m.slot.rank, m.slot.local_rank, m.node_rank, node)
                for m in self._world.members
                if (node := by_id[m.worker_id].node) is not None
            ],
            self._world.size,
            self.stats.resets,
        )
        logger.info(
            "Published group %s: %s.",
            self._generation,
            ", ".join(f"{m.worker_id}@{m.slot.host_id}" for m in self._world.members),
        )

    def _group_failed_without_a_death(self, ray: Any) -> bool:
        """Whether workers reported that the current group failed (polled a few times a second)."""
        now = time.monotonic()
        if self._world is None or now < self._next_failure_poll:
            return False
        self._next_failure_poll = now + _FAILURE_POLL_S
        reports = ray.get(self.coordinator.take_failures.remote(), timeout=30)
        current = [r for r in reports if r[1] == self._world.generation]
        if current:
            logger.warning("Group %s failed (%s); forming a new one.", self._world.generation, current[0][2])
        return bool(current)

    def _give_up_on_slow_starts(self) -> None:
        """A worker that has not started within the start-up grace (say, no node can host it) counts as failed."""
        import ray

        now = time.monotonic()
        for worker in list(self._workers.values()):
            if (
                worker.node is None
                and not worker.stopping
                and not worker.spare  # a spare waits for resources as long as it takes
                and now - worker.spawned_at > self.startup_grace_s
            ):
                worker.stopping = True
                ray.kill(worker.actor, no_restart=True)
                self._on_died(worker, f"did not start within {self.startup_grace_s} s")

    def _unpublished_ready(self) -> bool:
        members = {m.worker_id for m in self._world.members} if self._world else set()
        return any(
            w.run_ref is not None and not w.stopping and w.worker_id not in members for w in self._workers.values()
        )

    def _starting_recently(self) -> bool:
        """Some worker is still starting, and not for longer than the start-up grace."""
        now = time.monotonic()
        return any(
            w.node is None and not w.stopping and not w.spare and now - w.spawned_at < self.startup_grace_s
            for w in self._workers.values()
        )

    def actors(self) -> dict[str, Any]:
        """The running workers' actor handles by worker id (for tools and fault-injection tests)."""
        return {w.worker_id: w.actor for w in self._workers.values() if w.run_ref is not None and not w.stopping}

    def _rank_of(self, worker: _Worker) -> int:
        member = self._world.member(worker.worker_id) if self._world else None
        return member.slot.rank if member else -1

    def _stop_all(self, ray: Any) -> None:
        for worker in self._workers.values():
            worker.stopping = True
            ray.kill(worker.actor, no_restart=True)
        self._workers.clear()
        for actor in self._retired:
            with contextlib.suppress(Exception):  # already gone: nothing to stop
                ray.kill(actor, no_restart=True)
        self._retired.clear()


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
