"""The rendezvous actor of an elastic job: the driver publishes worlds, workers join them and beat.

Workers cannot call the driver process, so this small async actor (zero CPU) sits between them. Every wait in it
is one short chunk, bounded by the caller; a caller waits chunk after chunk only while the driver keeps polling
(its lease), so a worker never waits on a driver that stopped answering for longer than that lease.

It also keeps the job's commit high-water mark: the most commits any worker's state was known to hold (workers
tell it when they arrive and with every beat). It outlives every worker, so a world whose members hold no
commits can tell a fresh job from one whose committed state died with its last holders.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field

from elastrain.executor._private.elastic.world import PackedWorld, World

# A quick call on the rendezvous actor (driver or worker side) that takes longer than this means it is gone or stuck.
CONTROL_TIMEOUT_S = 30.0
# Calls the rendezvous actor runs at once. Each worker keeps up to two waiting there (its watch for new groups, and
# a join, an arrival or a store wait); Ray's default for an async actor, 1,000, queued every other call behind
# them from about 400 workers on, for as long as a wait lasts (up to 30 s). A waiting call costs one coroutine.
MAX_CONCURRENT_CALLS = 100_000


def rendezvous_actor(options: dict[str, object]) -> object:
    """A new rendezvous actor for one call, with Ray ``options`` (placement)."""
    import ray

    return ray.remote(Coordinator).options(max_concurrency=MAX_CONCURRENT_CALLS, **options).remote()


@dataclass(frozen=True)
class WaitResult:
    """What a worker's wait chunk found. ``value`` is None while the wait goes on."""

    value: object
    driver_silent_s: float  # seconds since the driver last polled: the worker's lease check
    high_water: int = 0  # the job's commit high-water mark when the answer was made


@dataclass(frozen=True)
class CoordinatorReport:
    """What the driver learns at each poll."""

    failures: list[tuple[str, int, str]] = field(default_factory=list)  # (worker, generation, reason)
    silent: dict[str, float] = field(default_factory=dict)  # worker id → seconds since its last beat
    # The current world while some of its members have not arrived: (generation, seconds since published,
    # the members still missing).
    missing: tuple[int, float, tuple[str, ...]] | None = None
    # Run events workers reported since the last poll, in order: (worker, kind, fields). Kinds:
    # "state_lost_start_over" and "state_resumed_from_persistence" (fields: generation, commits, high_water,
    # lost_commits, as the kind has them).
    events: list[tuple[str, str, dict[str, object]]] = field(default_factory=list)


class Coordinator:
    """Each wait has its own event, so that one arrival or beat wakes only those it concerns: with one shared
    condition every arrival woke every waiting member, and a group of N cost N² wake-ups to form."""

    def __init__(self) -> None:
        self._world: World | None = None
        self._packed: PackedWorld | None = None
        self._member_ids: frozenset[str] = frozenset()  # the current world's members
        self._published_at = 0.0
        self._published = asyncio.Event()  # set (and replaced) at each publish: joiners wait on it
        self._stores: dict[int, tuple[str, int]] = {}
        self._store_set: dict[int, asyncio.Event] = {}
        self._arrived: dict[int, set[str]] = {}
        self._arrived_members = 0  # members of the current world that arrived
        self._settled: dict[int, asyncio.Event] = {}  # a generation's: every member arrived, or it was replaced
        self._complete: set[int] = set()  # generations whose members all arrived
        self._members_so_far: set[str] = set()  # every worker that has been in a published world
        self._failed = asyncio.Event()  # a failure waits for the driver's next poll
        self._failures: list[tuple[str, int, str]] = []
        self._beats: dict[str, float] = {}  # worker id → when it last beat (this process's monotonic clock)
        self._driver_seen = time.monotonic()
        self._high_water = 0  # the most commits any worker reported
        self._events: list[tuple[str, str, dict[str, object]]] = []

    # -- driver side -----------------------------------------------------------------------------------------

    async def publish(self, world: World) -> None:
        self._world = world
        self._packed = PackedWorld.of(world)  # what every joining member gets: pickled once, not per answer
        self._member_ids = frozenset(m.worker_id for m in world.members)
        self._published_at = time.monotonic()
        self._driver_seen = self._published_at
        self._members_so_far |= self._member_ids
        for generation in [g for g in self._stores if g < world.generation]:
            del self._stores[generation]
        for generation in [g for g in self._store_set if g < world.generation]:
            self._store_set.pop(generation).set()  # replaced: its members waiting for the store give up now
        for generation in [g for g in self._arrived if g < world.generation]:
            del self._arrived[generation]
        for generation in [g for g in self._settled if g != world.generation]:
            self._settled.pop(generation).set()  # replaced: its waiting members join the next world
        self._complete = {g for g in self._complete if g >= world.generation - 1}
        arrived = self._arrived.get(world.generation, set())
        self._arrived_members = len(arrived & self._member_ids)
        self._check_complete(world.generation)
        self._published.set()
        self._published = asyncio.Event()

    async def poll(self, liveness_timeout_s: float) -> CoordinatorReport:
        """Failures reported since the last poll, workers silent for longer than ``liveness_timeout_s``, and who
        has not arrived in the current world. Each poll also renews the driver's lease."""
        now = time.monotonic()
        self._driver_seen = now
        failures, self._failures = self._failures, []
        self._failed.clear()
        events, self._events = self._events, []
        silent = {w: now - t for w, t in self._beats.items() if now - t > liveness_timeout_s}
        missing = None
        world = self._world
        if world is not None and world.generation not in self._complete:
            arrived = self._arrived.get(world.generation, set())
            absent = tuple(m.worker_id for m in world.members if m.worker_id not in arrived)
            missing = (world.generation, now - self._published_at, absent)
        return CoordinatorReport(failures, silent, missing, events)

    async def failure_reported(self, timeout_s: float) -> bool:
        """Whether a failure waits for the driver's next poll: answers as soon as one is reported, else after
        ``timeout_s``. The driver keeps one such call pending, so it acts on a failed group at once."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._failed.wait(), timeout_s)
        return bool(self._failures)

    async def forget(self, worker_ids: list[str]) -> None:
        """Stop watching workers that are gone (their beats would otherwise read as silence)."""
        for worker_id in worker_ids:
            self._beats.pop(worker_id, None)

    # -- worker side -----------------------------------------------------------------------------------------

    async def beat(self, worker_id: str, commits: int = 0) -> None:
        self._beats[worker_id] = time.monotonic()
        self._high_water = max(self._high_water, commits)

    async def high_water(self) -> int:
        """The job's commit high-water mark."""
        return self._high_water

    async def restart_high_water(self) -> None:
        """The job's state started over from its initial state (the user's choice when it was lost)."""
        self._high_water = 0

    async def report_event(self, worker_id: str, kind: str, fields: dict[str, object]) -> None:
        """A run event for the driver's next poll (``CoordinatorReport.events``)."""
        self._events.append((worker_id, kind, dict(fields)))

    async def join(self, worker_id: str, after_generation: int, timeout_s: float) -> WaitResult:
        """The first world newer than ``after_generation`` that concerns the worker: its next group, as a
        PackedWorld.

        A worker that was in an earlier world gets the next world even when it is not in it, so it learns it
        was dropped. A new worker waits for a world that includes it (the driver adds it once it is ready).
        ``value`` is None when no such world appears within ``timeout_s``.
        """

        def ready() -> bool:
            world = self._world
            if world is None or world.generation <= after_generation:
                return False
            return worker_id in self._member_ids or worker_id in self._members_so_far

        deadline = time.monotonic() + timeout_s
        while not ready():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._published.wait(), remaining)
        return WaitResult(self._packed if ready() else None, self._driver_silent())

    async def arrive(self, generation: int, worker_id: str, timeout_s: float, commits: int = 0) -> WaitResult:
        """Wait until every member of world ``generation`` arrived: ``value`` True. False when that world was
        replaced by a newer one (a member died or more workers came): the caller joins the next world. None
        when neither happened within ``timeout_s``: the caller waits again (it stays counted as arrived).
        ``commits``: how many commits the caller's state holds; every answer carries the job's high-water mark,
        which, once every member arrived, includes every member's count.

        Forming a torch process group blocks until all ranks connect; this barrier makes sure they all come
        before anyone blocks there, so a worker never waits for peers who went on to a newer world. Survivors
        arrive at their next commit, which may be far off; how long a member may stay away is the driver's call.
        """
        self._high_water = max(self._high_water, commits)
        arrived = self._arrived.setdefault(generation, set())
        world = self._world
        current = world is not None and world.generation == generation
        if worker_id not in arrived:
            arrived.add(worker_id)
            if current and worker_id in self._member_ids:
                self._arrived_members += 1
        if current:
            self._check_complete(generation)

        def settled() -> bool:
            current = self._world
            return generation in self._complete or current is None or current.generation != generation

        if not settled():
            event = self._settled.setdefault(generation, asyncio.Event())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), timeout_s)
        if generation in self._complete:
            return WaitResult(True, self._driver_silent(), self._high_water)
        if settled():
            arrived.discard(worker_id)  # gone from this generation: it must not count as present
            return WaitResult(False, self._driver_silent(), self._high_water)
        return WaitResult(None, self._driver_silent(), self._high_water)

    async def watch(self, after_generation: int, timeout_s: float) -> int | None:
        """Long-poll: the published generation, as soon as it is newer than ``after_generation``; None after
        ``timeout_s`` without one. Each worker keeps one such call pending (``worker/world_watch.py``), so that it
        learns of a new world at once and no longer asks at every commit."""
        deadline = time.monotonic() + timeout_s
        while self._world is None or self._world.generation <= after_generation:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._published.wait(), remaining)
        return self._world.generation

    async def newer_world(self, generation: int) -> tuple[str, ...] | None:
        """The member ids of the published world when it is newer than ``generation``; None when it is not."""
        world = self._world
        if world is None or world.generation <= generation:
            return None
        return tuple(m.worker_id for m in world.members)

    async def set_store(self, generation: int, host: str, port: int) -> None:
        """Rank 0 of a world tells where the world's TCPStore listens."""
        self._stores[generation] = (host, port)
        self._store_set.setdefault(generation, asyncio.Event()).set()

    async def get_store(self, generation: int, timeout_s: float) -> tuple[str, int] | None:
        """Where world ``generation``'s store listens, once its rank 0 said; None after ``timeout_s``, or as soon as
        a newer world replaced it (its rank 0 may be gone)."""
        if generation not in self._stores and not self._replaced(generation):
            event = self._store_set.setdefault(generation, asyncio.Event())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), timeout_s)
        return self._stores.get(generation)

    async def report_failure(self, worker_id: str, generation: int, reason: str) -> None:
        """A worker saw its group fail. A peer's death also reaches the driver through Ray; a failure without
        one (a formation that timed out, a collective that hung) reaches it only through this."""
        self._failures.append((worker_id, generation, reason))
        self._failed.set()

    def _replaced(self, generation: int) -> bool:
        return self._world is not None and self._world.generation > generation

    def _check_complete(self, generation: int) -> None:
        """Once every member of the current world ``generation`` arrived, wake them all."""
        world = self._world
        if world is None or world.generation != generation or self._arrived_members < len(self._member_ids):
            return
        self._complete.add(generation)
        event = self._settled.pop(generation, None)
        if event is not None:
            event.set()

    def _driver_silent(self) -> float:
        return time.monotonic() - self._driver_seen
