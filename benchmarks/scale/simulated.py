"""Simulated workers, many to a process, that run the real worker-side protocol of an elastic job.

Each :class:`SimHost` is one Ray actor process holding many simulated workers, one thread each. A simulated
worker is the real ``Runtime`` of ``elastrain.executor`` (joining each group, arriving, its heartbeat thread,
commits told to the rendezvous actor, asking for a newer group at every commit, reporting a failed group) and
the real ``send()`` path (a ``Worker``'s sender and its sink); only the torch process group and the training
step are stand-ins: a group forms through the rendezvous actor's store exchange, without a TCPStore, and a step
is a wait of ``step_s``.

A killed simulated worker stops beating at once and its call ends with a :data:`DIED` marker, which the
harness's driver turns into the ``Died`` event Ray would give (``harness.SimDriver``). The peers of a killed
worker see their collective fail, as gloo's would once the dead process's sockets close: the harness poisons
the killed worker's generation on every host (:meth:`SimHost.poison`).
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from typing import Any

from elastrain.executor._private.context import WorkerContext, _WorkerState
from elastrain.executor._private.elastic.coordinator import CONTROL_TIMEOUT_S
from elastrain.executor._private.elastic.worker.group import InternalError, Runtime, WorkerRemoved
from elastrain.executor._private.elastic.worker.process_group import ProcessGroup
from elastrain.executor._private.node import NodeInfo
from elastrain.executor._private.versions import running_versions
from elastrain.executor._private.worker import Worker

# What a simulated worker's call returns when it was killed; the harness's driver reads it as Ray's ActorDiedError.
DIED = "__simulated_worker_died__"


class _Killed(Exception):
    pass


class SimProcessGroup(ProcessGroup):
    """The stand-in for a world's torch process group: rank 0 tells the rendezvous actor where its store would
    listen and the others wait for that, as the real group does, and nothing else is formed."""

    def form(
        self, coordinator: Any, backend: str, formation_timeout_s: float, collective_timeout_s: float
    ) -> tuple[str, int]:
        import ray

        if self.rank == 0:
            master = ("127.0.0.1", 29_500 + self.generation % 1000)
            ray.get(coordinator.set_store.remote(self.generation, *master), timeout=CONTROL_TIMEOUT_S)
        else:
            master = self._wait_for_store(coordinator, formation_timeout_s)
        self.master = master
        return master


class SimHost:
    """Ray actor (threaded): many simulated workers in one process."""

    def __init__(self, step_s: float, start_s: float) -> None:
        from harness import allow_slow_control_calls

        allow_slow_control_calls()
        self.step_s, self.start_s = step_s, start_s
        self.send_hz = 0.0
        self._lock = threading.Lock()
        self._killed: dict[str, threading.Event] = {}
        self._runtimes: dict[str, Runtime] = {}
        self._poisoned: set[int] = set()
        self._woken = threading.Condition(self._lock)  # a kill, a poison or the finish wakes stepping workers
        self._finish = False
        # (worker id, generation, group size, rank, time of its first step in that generation)
        self._first_steps: dict[tuple[str, int], tuple[int, int, float]] = {}
        self._sent = 0
        # send() reads the process's worker context; every simulated worker shares this one, with its own sender id.
        _WorkerState.context = WorkerContext(
            rank=0, size=1, local_rank=0, local_size=1, cross_rank=0, cross_size=1, node_rank=0, num_nodes=1,
            node_id="", node_ip="127.0.0.1", hostname="sim", pid=os.getpid(),
        )  # fmt: skip

    # -- what the pool calls, as on a worker actor -------------------------------------------------------------

    def prepare(self, worker_id: str, host_id: str) -> NodeInfo:
        """A worker's start: ``start_s`` of waiting stands in for its actor's start and its import of torch."""
        with self._lock:
            self._killed[worker_id] = threading.Event()
        time.sleep(self.start_s)
        return NodeInfo(host_id, "127.0.0.1", host_id, os.getpid(), (), running_versions())

    def alive(self, worker_id: str) -> bool:
        if self._dead(worker_id):
            raise RuntimeError(f"simulated worker {worker_id} was killed")
        return True

    def run_elastic(
        self, worker_id: str, payload: Any, call_id: int, _: str, coordinator: Any, options: Any, sink: Any
    ) -> Any:
        runtime = Runtime(coordinator, worker_id, options)
        runtime.process_group_class = SimProcessGroup
        sender = Worker()
        sender._sink, sender._sender_id = sink, worker_id
        sender._begin(call_id)
        with self._lock:
            self._runtimes[worker_id] = runtime
        try:
            runtime.start()
            return self._train(worker_id, runtime, sender)
        except WorkerRemoved:
            return None
        except _Killed:
            return DIED
        finally:
            if not self._dead(worker_id):
                sender._flush_messages()
            runtime.close()

    def kill(self, worker_id: str) -> None:
        """The worker's process is gone: it beats no more, and its call ends at once where it waits."""
        with self._lock:
            event = self._killed.setdefault(worker_id, threading.Event())
            event.set()
            runtime = self._runtimes.get(worker_id)
            self._woken.notify_all()
        if runtime is not None and runtime._heartbeat is not None:
            runtime._heartbeat.stop()

    def kill_all(self) -> None:
        for worker_id in list(self._killed):
            self.kill(worker_id)

    # -- what the harness calls ----------------------------------------------------------------------------------

    def poison(self, generation: int) -> None:
        """Members of ``generation`` lost a peer: their next collective fails."""
        with self._lock:
            self._poisoned.add(generation)
            self._woken.notify_all()

    def set_send_rate(self, hz: float) -> None:
        self.send_hz = hz

    def finish(self) -> None:
        with self._lock:
            self._finish = True
            self._woken.notify_all()

    def first_steps(self, since_generation: int = 0) -> dict[tuple[str, int], tuple[int, int, float]]:
        with self._lock:
            return {key: value for key, value in self._first_steps.items() if key[1] >= since_generation}

    def usage(self) -> dict[str, float]:
        return {
            "pid": os.getpid(),
            "cpu_s": time.process_time(),
            "sent": self._sent,
            "threads": threading.active_count(),
        }

    # -- a simulated worker ----------------------------------------------------------------------------------------

    def _dead(self, worker_id: str) -> bool:
        event = self._killed.get(worker_id)
        return event is not None and event.is_set()

    def _train(self, worker_id: str, runtime: Runtime, sender: Worker) -> Any:
        """The loop ``elastic.run`` runs around a training function that commits every step."""
        commits = 0
        rejoin = True
        while True:
            if rejoin:
                runtime.join_next_world()
                rejoin = False
                # The state sync: every member takes the most commits any holder has.
                commits = max(commits, runtime.high_water)
                runtime.hold(commits)
                generation, member = runtime.generation, runtime.member
                assert member is not None
                assert runtime.world is not None
                first = True
            if first:  # the group formed and the state is in sync: training resumes now
                with self._lock:
                    self._first_steps[(worker_id, generation)] = (runtime.world.size, member.slot.rank, time.time())
                first = False
            try:
                self._step(worker_id, generation)
            except InternalError as error:  # the stand-in collective failed: roll back, form the next group
                runtime.report_failure(error)
                rejoin = True
                continue
            self._send(sender, commits)
            commits += 1
            runtime.hold(commits)
            if self._finish:
                return (generation, member.slot.rank, commits)
            if runtime.published_update():  # a commit's check for a newer group (hosts added or removed)
                rejoin = True

    def _step(self, worker_id: str, generation: int) -> None:
        """One training step: ``step_s`` of waiting, cut short by a kill or a failed collective."""
        deadline = time.monotonic() + self.step_s
        with self._lock:
            while True:
                if self._dead(worker_id):
                    raise _Killed
                if generation in self._poisoned:
                    raise InternalError(f"a peer of group {generation} is gone")
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._finish:
                    return
                self._woken.wait(remaining)

    def _send(self, sender: Worker, commits: int) -> None:
        count = round(self.send_hz * self.step_s)
        for index in range(count):
            sender._send({"step": commits, "index": index, "loss": 1.0 / (commits + 1)})
        if count:
            with self._lock:
                self._sent += count


class SimHandle:
    """What the driver holds of a simulated worker: an actor handle's shape, aimed at its host process."""

    def __init__(self, process: Any, worker_id: str, host_id: str) -> None:
        self.process, self.worker_id, self.host_id = process, worker_id, host_id
        self._actor_id = bytes.fromhex(hashlib.sha256(worker_id.encode()).hexdigest()[:32])

    @property
    def prepare(self) -> _Method:
        return _Method(lambda *_: self.process.prepare.remote(self.worker_id, self.host_id))

    @property
    def run_elastic(self) -> _Method:
        return _Method(lambda *args: self.process.run_elastic.remote(self.worker_id, *args))

    @property
    def alive(self) -> _Method:
        return _Method(lambda *_: self.process.alive.remote(self.worker_id))


class _Method:
    def __init__(self, call: Any) -> None:
        self._call = call

    def options(self, **_: Any) -> _Method:
        return self

    def remote(self, *args: Any) -> Any:
        return self._call(*args)


def sim_host_class() -> Any:
    import ray

    # Every simulated worker holds a thread in a call, and a second for its heartbeat; the rest is headroom.
    return ray.remote(num_cpus=0, max_concurrency=1024)(SimHost)


def spread(host_ids: list[str], processes: int) -> dict[str, int]:
    """Which process simulates each host's workers: hosts dealt out in turn."""
    return {host: index % processes for index, host in enumerate(host_ids)}
