"""The scale harness: the real driver, rendezvous actor and message actor of an elastic job on a real local Ray,
with N simulated workers (``simulated.py``) on K = N / 4 simulated hosts.

What is real: ``ElasticDriver`` (its pure core and its Ray shell, one thread of this process), the ``Coordinator``
and ``MessageSink`` actors, ``HostManager`` polling a discovery, and the worker side's ``Runtime`` and ``send()``.
What stands in: the discovery (it reports the simulated hosts, and can add some), the workers' processes (many
threads to a process), their torch process group and their training step (``simulated.py``).

``run_job(n)`` drives one job through its phases and returns what each took.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from simulated import DIED, SimHandle, sim_host_class, spread

from elastrain.discovery import HostDiscovery, HostManager
from elastrain.executor._private.elastic.coordinator import (
    MAX_CONCURRENT_CALLS,
    Coordinator,
    CoordinatorReport,
    WaitResult,
)
from elastrain.executor._private.elastic.driver import events as ev
from elastrain.executor._private.elastic.driver.pool import WorkerHandle, WorkerPool
from elastrain.executor._private.elastic.driver.shell import ElasticDriver
from elastrain.executor._private.elastic.options import ElasticOptions
from elastrain.executor._private.elastic.world import World
from elastrain.executor._private.messages import MessageSink, delivering
from elastrain.executor._private.options import ExecutorOptions
from elastrain.executor._private.placement import control_actor_options

SLOTS_PER_HOST = 4
WORKERS_PER_PROCESS = 64
SEND_HZ = 10.0
# Every simulated worker and the control plane share this machine's cores; a worker starved of CPU for a few
# seconds is no frozen worker, so the harness gives silence longer than the default 8 s. Beats still come every
# second (their interval is capped at 1 s).
LIVENESS_S = 30.0
# Likewise for one quick call into the rendezvous actor: the product gives up after 30 s (the actor's node is
# taken to be gone); here the actor shares two cores with every simulated worker, so the harness waits longer.
CONTROL_TIMEOUT_S = 180.0


def allow_slow_control_calls(timeout_s: float = CONTROL_TIMEOUT_S) -> None:
    """Let quick calls into the rendezvous actor take ``timeout_s`` in this process (driver or host process)."""
    from elastrain.executor._private.elastic.driver import shell
    from elastrain.executor._private.elastic.worker import group, process_group, world_watch

    for module in (shell, group, process_group, world_watch):
        module.CONTROL_TIMEOUT_S = timeout_s  # type: ignore[attr-defined]


class SimDiscovery(HostDiscovery):
    """Reports the simulated hosts; ``add`` makes more appear at discovery's next poll."""

    def __init__(self, hosts: int) -> None:
        self._lock = threading.Lock()
        self._hosts = {f"sim-{i:05d}": SLOTS_PER_HOST for i in range(hosts)}

    def find_available_hosts_and_slots(self) -> dict[str, int]:
        with self._lock:
            return dict(self._hosts)

    def add(self, count: int) -> list[str]:
        with self._lock:
            start = len(self._hosts)
            added = [f"sim-{i:05d}" for i in range(start, start + count)]
            self._hosts.update(dict.fromkeys(added, SLOTS_PER_HOST))
            return added


class CountingCoordinator(Coordinator):
    """The rendezvous actor, counting its calls and able to say its process's CPU time."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: Counter[str] = Counter()

    async def usage(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "cpu_s": time.process_time(), "calls": dict(self.calls)}

    async def beat(self, worker_id: str, commits: int = 0) -> None:
        self.calls["beat"] += 1
        await super().beat(worker_id, commits)

    async def join(self, worker_id: str, after_generation: int, timeout_s: float) -> WaitResult:
        self.calls["join"] += 1
        return await super().join(worker_id, after_generation, timeout_s)

    async def arrive(self, generation: int, worker_id: str, timeout_s: float, commits: int = 0) -> WaitResult:
        self.calls["arrive"] += 1
        return await super().arrive(generation, worker_id, timeout_s, commits)

    async def newer_world(self, generation: int) -> tuple[str, ...] | None:
        self.calls["newer_world"] += 1
        return await super().newer_world(generation)

    async def watch(self, after_generation: int, timeout_s: float) -> int | None:
        self.calls["watch"] += 1
        return await super().watch(after_generation, timeout_s)

    async def set_store(self, generation: int, host: str, port: int) -> None:
        self.calls["set_store"] += 1
        await super().set_store(generation, host, port)

    async def poll(self, liveness_timeout_s: float) -> CoordinatorReport:
        self.calls["poll"] += 1
        return await super().poll(liveness_timeout_s)

    async def report_failure(self, worker_id: str, generation: int, reason: str) -> None:
        self.calls["report_failure"] += 1
        await super().report_failure(worker_id, generation, reason)

    async def get_store(self, generation: int, timeout_s: float) -> tuple[str, int] | None:
        self.calls["get_store"] += 1
        return await super().get_store(generation, timeout_s)


class SimPool(WorkerPool):
    """Starts simulated workers in the host processes instead of one Ray actor each."""

    def __init__(self, options: ExecutorOptions, processes: list[Any], placement: dict[str, int]) -> None:
        super().__init__(options, worker_class=None)
        self.processes = processes
        self.placement = placement
        self.spawned_at: dict[str, float] = {}

    def spawn(self, worker_id: str, host_id: str) -> WorkerHandle:
        return self._start(worker_id, host_id)

    def _start(self, worker_id: str, host_id: str, **placement: Any) -> WorkerHandle:
        process = self.processes[self.placement.setdefault(host_id, len(self.placement) % len(self.processes))]
        handle = SimHandle(process, worker_id, host_id)
        worker = WorkerHandle(worker_id, host_id, handle, handle.prepare.remote())
        with self._lock:
            self._workers[worker_id] = worker
        self.spawned_at[worker_id] = time.time()
        return worker

    def stop(self, worker: WorkerHandle, *, unresponsive: bool = False) -> None:
        worker.holds_bundle = False
        self.kill(worker)

    def kill(self, worker: WorkerHandle) -> None:
        worker.actor.process.kill.remote(worker.worker_id)

    def stop_all(self) -> None:
        for process in self.processes:
            process.kill_all.remote()

    def node_alive(self, node_id: str) -> bool:
        return True  # simulated hosts never go away with their workers

    def ready_to_kill_on(self, node: Any) -> None:
        pass


class SimDriver(ElasticDriver):
    """The real driver; it reads a simulated worker's death as Ray's, and records when it publishes and how much
    CPU each loop iteration takes."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.published: list[tuple[float, World]] = []
        self.iteration_cpu_s: list[tuple[float, float]] = []  # (when, thread CPU seconds since the last)
        self._last_cpu = time.thread_time()

    def _gather(self, ray: Any) -> list[ev.Event]:
        now_cpu = time.thread_time()
        self.iteration_cpu_s.append((time.time(), now_cpu - self._last_cpu))
        self._last_cpu = now_cpu
        return super()._gather(ray)

    def _run_ended(self, ray: Any, worker: WorkerHandle) -> ev.Event:
        try:
            outcome = ray.get(worker.run_ref)
        except Exception:
            outcome = None
        if outcome == DIED:
            worker.run_ref = None
            return ev.Died(worker.worker_id, "simulated worker killed", node_lost=False)
        return super()._run_ended(ray, worker)

    def _publish(self, ray: Any, action: ev.Publish) -> None:
        super()._publish(ray, action)
        self.published.append((time.time(), action.world))


def _wait(condition: Callable[[], Any], timeout_s: float, what: str, every_s: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(every_s)


def _rss_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


class Job:
    """One simulated elastic job of ``n`` workers, its driver in a thread of this process."""

    def __init__(self, n: int, step_s: float, start_s: float) -> None:
        import ray

        allow_slow_control_calls()
        self.n = n
        self.ray = ray
        hosts = n // SLOTS_PER_HOST
        self.discovery = SimDiscovery(hosts)
        host_ids = list(self.discovery.find_available_hosts_and_slots())
        processes = max(1, -(-n // WORKERS_PER_PROCESS))
        self.processes = [sim_host_class().remote(step_s, start_s) for _ in range(processes)]
        ray.get([p.usage.remote() for p in self.processes], timeout=120)
        self.manager = HostManager(self.discovery, poll_interval_s=1.0).start()
        self.coordinator = (
            ray.remote(CountingCoordinator)
            .options(max_concurrency=MAX_CONCURRENT_CALLS, **control_actor_options())
            .remote()
        )
        self.sink = ray.remote(MessageSink).options(**control_actor_options()).remote()
        ray.get([self.coordinator.usage.remote()], timeout=60)
        options = ExecutorOptions(
            num_workers=max(1, n // 2), num_hosts=None, num_workers_per_host=1, cpus_per_worker=0.0, use_gpu=False,
            gpus_per_worker=0.0, use_current_placement_group=False, elastic=True, min_workers=max(1, n // 2),
            max_workers=n + 10 * SLOTS_PER_HOST, reset_limit=None, cooldown_range=None, elastic_timeout=600.0,
            override_discovery=False,
        )  # fmt: skip
        self.pool = SimPool(options, self.processes, spread(host_ids, processes))
        self.driver = SimDriver(
            options=options,
            manager=self.manager,
            coordinator=self.coordinator,
            sink=self.sink,
            worker_class=None,
            elastic_options=ElasticOptions(
                formation_timeout_s=120.0,
                collective_timeout_s=120.0,
                backend="gloo",
                liveness_timeout_s=LIVENESS_S,
                driver_lease_s=CONTROL_TIMEOUT_S,
            ),
            startup_grace_s=120.0,
            pool=self.pool,
        )
        self.delivered = 0
        self.results: list[Any] | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="sim-driver", daemon=True)

    def _count(self, message: dict[str, Any]) -> None:
        self.delivered += 1

    def _run(self) -> None:
        try:
            with delivering(self.sink, [self._count], 1, 30.0):
                self.results = self.driver.run(None, 1)
        except BaseException as error:  # reported by the main thread
            self.error = error

    def start(self) -> float:
        started = time.time()
        self._thread.start()
        return started

    def check(self) -> None:
        if self.error is not None:
            raise RuntimeError(f"the simulated job failed: {self.error}") from self.error

    def first_steps(self, since_generation: int = 0) -> dict[tuple[str, int], tuple[int, int, float]]:
        merged: dict[tuple[str, int], tuple[int, int, float]] = {}
        calls = [p.first_steps.remote(since_generation) for p in self.processes]
        for found in self.ray.get(calls, timeout=180):
            merged.update(found)
        return merged

    def world(self) -> World:
        return self.driver.published[-1][1]

    def all_stepped(self, world: World) -> float | None:
        """When the last member of ``world`` took its first step in it; None while some have not."""
        self.check()
        steps = self.first_steps(world.generation)
        times = [steps.get((m.worker_id, world.generation)) for m in world.members]
        return None if any(t is None for t in times) else max(t[2] for t in times if t is not None)

    def stepped_after(self, worker_ids: list[str], generation: int) -> float | None:
        """When the last of ``worker_ids`` took its first step in a group newer than ``generation``."""
        self.check()
        first: dict[str, float] = {}
        for (worker_id, stepped_in), (_, _, at) in self.first_steps(generation + 1).items():
            if stepped_in > generation:
                first[worker_id] = min(at, first.get(worker_id, at))
        return max(first[w] for w in worker_ids) if all(w in first for w in worker_ids) else None

    def settled(self, size: int, timeout_s: float) -> tuple[World, float]:
        """Wait for the published group of ``size`` whose every member stepped in it."""

        def done() -> tuple[World, float] | None:
            self.check()
            if not self.driver.published or self.world().size != size:
                return None
            world = self.world()
            stepped = self.all_stepped(world)
            return None if stepped is None else (world, stepped)

        # Each look asks every host process; the times come from the workers' own clocks, so looking less often
        # changes nothing measured but the harness's own load on the machine.
        found: tuple[World, float] = _wait(done, timeout_s, f"every one of {size} workers to step in one group", 0.5)
        return found

    def usage(self) -> dict[str, Any]:
        coordinator = self.ray.get(self.coordinator.usage.remote(), timeout=60)
        hosts = self.ray.get([p.usage.remote() for p in self.processes], timeout=60)
        return {"coordinator": coordinator, "hosts": hosts, "delivered": self.delivered, "at": time.monotonic()}

    def finish(self, timeout_s: float) -> None:
        self.ray.get([p.finish.remote() for p in self.processes], timeout=60)
        self._thread.join(timeout_s)
        self.check()
        if self._thread.is_alive():
            core = self.driver.core
            phases = Counter(w.phase.value for w in core.roster)
            raise TimeoutError(
                f"the simulated job did not finish: {core.phase.value}, workers {dict(phases)}, "
                f"{len(core.results.finished)} finished, group {core.world.generation if core.world else None}"
            )

    def close(self) -> None:
        self.manager.stop()
        for actor in (*self.processes, self.coordinator, self.sink):
            self.ray.kill(actor, no_restart=True)


def _cpu_since(before: dict[str, Any], after: dict[str, Any]) -> float:
    """The rendezvous actor's CPU seconds between two usages."""
    return float(after["coordinator"]["cpu_s"] - before["coordinator"]["cpu_s"])


def _machine_busy_s() -> float:
    """CPU seconds this machine's cores were busy since boot (/proc/stat; 0 where there is none)."""
    try:
        fields = [int(f) for f in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    except OSError:
        return 0.0
    idle = fields[3] + fields[4]  # idle, iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _busy_since(before_s: float, wall_s: float) -> float:
    """How many of this machine's cores were busy, on average, over the last ``wall_s``."""
    return (_machine_busy_s() - before_s) / wall_s if wall_s > 0 else 0.0


def _rate(before: dict[str, Any], after: dict[str, Any]) -> dict[str, float]:
    wall = after["at"] - before["at"]
    calls_before, calls_after = before["coordinator"]["calls"], after["coordinator"]["calls"]
    per_kind = {k: (calls_after.get(k, 0) - calls_before.get(k, 0)) / wall for k in calls_after}
    return {
        "wall_s": wall,
        "coordinator_calls_per_s": sum(per_kind.values()),
        "coordinator_cpu": (after["coordinator"]["cpu_s"] - before["coordinator"]["cpu_s"]) / wall,
        "calls_by_kind_per_s": per_kind,  # type: ignore[dict-item]
        "delivered_per_s": (after["delivered"] - before["delivered"]) / wall,
        "sent_per_s": sum(h["sent"] for h in after["hosts"]) / wall - sum(h["sent"] for h in before["hosts"]) / wall,
        "hosts_cpu": sum(a["cpu_s"] - b["cpu_s"] for a, b in zip(after["hosts"], before["hosts"], strict=True)) / wall,
    }


def run_job(
    n: int, *, step_s: float = 1.0, start_s: float = 2.0, window_s: float = 5.0, timeout_s: float = 300.0
) -> dict[str, Any]:
    """One job of ``n`` simulated workers through start, steady state, one failure, its replacement, 10 hosts
    added, and ``send()`` at 10 messages a second per worker. A simulated worker takes ``step_s`` per step and
    ``start_s`` to start (a real one starts its actor and imports torch meanwhile). Times in seconds."""
    rss_before = _rss_bytes()
    job = Job(n, step_s, start_s)
    found: dict[str, Any] = {
        "n": n, "hosts": n // SLOTS_PER_HOST, "processes": len(job.processes), "step_s": step_s, "start_s": start_s,
    }  # fmt: skip
    try:
        machine_before, start_usage = _machine_busy_s(), job.usage()
        started = job.start()
        world, stepped = job.settled(n, timeout_s)
        found["start_to_first_group_s"] = stepped - started
        found["start_to_first_publish_s"] = job.driver.published[0][0] - started
        found["start_coordinator_cpu_s"] = _cpu_since(start_usage, job.usage())
        found["start_machine_busy"] = _busy_since(machine_before, stepped - started)

        # Steady state: every worker beats, commits and checks for a newer group every step. From its second
        # step on: a worker's first commit is told to the rendezvous actor at once, once.
        time.sleep(step_s * 1.5)
        before = job.usage()
        loop_from = len(job.driver.iteration_cpu_s)
        time.sleep(window_s)
        steady = _rate(before, job.usage())
        loop = [cpu for _, cpu in job.driver.iteration_cpu_s[loop_from:]]
        found["steady"] = steady
        found["driver_iteration_cpu_s"] = statistics.median(loop) if loop else 0.0
        found["driver_iterations_per_s"] = len(loop) / steady["wall_s"]
        found["driver_rss_bytes"] = _rss_bytes() - rss_before

        # One failure: a member in the middle is killed; its peers' collective fails.
        victim = world.members[n // 2]
        spawned_before = set(job.pool.spawned_at)
        machine_before, failure_usage = _machine_busy_s(), job.usage()
        killed_at = time.time()
        ray = job.ray
        process = job.pool.get(victim.worker_id).actor.process  # type: ignore[union-attr]
        ray.get(process.kill.remote(victim.worker_id), timeout=60)
        ray.get([p.poison.remote(world.generation) for p in job.processes], timeout=60)
        smaller = _wait(
            lambda: next((w for t, w in job.driver.published if t >= killed_at and w.size == n - 1), None),
            timeout_s,
            "the group without the killed worker",
        )
        published_at = next(t for t, w in job.driver.published if w is smaller)
        found["failure_to_published_s"] = published_at - killed_at
        survivors = [m.worker_id for m in smaller.members]
        survivors_stepped = _wait(
            lambda: job.stepped_after(survivors, world.generation), timeout_s, "every survivor's next step", 0.25
        )
        found["failure_to_survivors_step_s"] = survivors_stepped - killed_at
        found["failure_coordinator_cpu_s"] = _cpu_since(failure_usage, job.usage())
        found["failure_machine_busy"] = _busy_since(machine_before, survivors_stepped - killed_at)

        # Its replacement: started by the driver at once; it joins at the survivors' next commit.
        whole, whole_stepped = job.settled(n, timeout_s)
        replacement = next(m.worker_id for m in whole.members if m.worker_id not in spawned_before)
        found["replacement_join_s"] = whole_stepped - job.pool.spawned_at[replacement]
        found["failure_to_whole_again_s"] = whole_stepped - killed_at

        # Discovery reports 10 more hosts at once.
        added_at = time.time()
        job.discovery.add(10)
        grown, grown_stepped = job.settled(n + 10 * SLOTS_PER_HOST, timeout_s)
        found["ten_hosts_added_to_step_s"] = grown_stepped - added_at

        # send(): every worker sends 10 messages a second.
        ray.get([p.set_send_rate.remote(SEND_HZ) for p in job.processes], timeout=60)
        time.sleep(step_s * 2)  # every worker's next step sends
        before = job.usage()
        time.sleep(window_s)
        sending = _rate(before, job.usage())
        found["sending"] = sending
        found["sending_workers"] = grown.size
        ray.get([p.set_send_rate.remote(0.0) for p in job.processes], timeout=60)

        job.finish(timeout_s)
        found["finished_workers"] = len(job.results or [])
        found["resets"] = job.driver.stats.resets
    finally:
        job.close()
    return found


if __name__ == "__main__":
    import json
    import sys

    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=True)
    for size in [int(a) for a in sys.argv[1:]] or [8]:
        print(json.dumps(run_job(size), indent=1, default=str), flush=True)
    ray.shutdown()
