"""The rendezvous actor of an elastic job: the driver publishes worlds, workers join them.

Workers cannot call the driver process, so this small async actor (zero CPU) sits between them. Every wait in
it is bounded by the caller's timeout.
"""

from __future__ import annotations

import asyncio
import contextlib

from elastrain.executor._private.elastic.world import World


class Coordinator:
    def __init__(self) -> None:
        self._world: World | None = None
        self._stores: dict[int, tuple[str, int]] = {}
        self._arrived: dict[int, set[str]] = {}
        self._complete: set[int] = set()  # generations whose members all arrived
        self._members_so_far: set[str] = set()  # every worker that has been in a published world
        self._changed = asyncio.Condition()
        self._failures: list[tuple[str, int, str]] = []

    # -- driver side -----------------------------------------------------------------------------------------

    async def publish(self, world: World) -> None:
        async with self._changed:
            self._world = world
            self._members_so_far.update(m.worker_id for m in world.members)
            for generation in [g for g in self._stores if g < world.generation]:
                del self._stores[generation]
            for generation in [g for g in self._arrived if g < world.generation]:
                del self._arrived[generation]
            self._complete = {g for g in self._complete if g >= world.generation - 1}
            self._changed.notify_all()

    async def take_failures(self) -> list[tuple[str, int, str]]:
        failures, self._failures = self._failures, []
        return failures

    # -- worker side -----------------------------------------------------------------------------------------

    async def join(self, worker_id: str, after_generation: int, timeout_s: float) -> World | None:
        """The first world newer than ``after_generation`` that concerns the worker: its next group.

        A worker that was in an earlier world gets the next world even when it is not in it, so it learns it
        was dropped. A new worker waits for a world that includes it (the driver adds it once it is ready).
        ``None`` when no such world appears within ``timeout_s``.
        """

        def ready() -> bool:
            world = self._world
            if world is None or world.generation <= after_generation:
                return False
            return world.member(worker_id) is not None or worker_id in self._members_so_far

        async with self._changed:
            try:
                await asyncio.wait_for(self._changed.wait_for(ready), timeout_s)
            except TimeoutError:
                return None
            return self._world

    async def arrive(self, generation: int, worker_id: str, timeout_s: float) -> bool:
        """Wait until every member of world ``generation`` arrived: True. False when that world was replaced by a
        newer one (a member died or more workers came) or the wait timed out: the caller joins the next world.

        Forming a torch process group blocks until all ranks connect; this barrier makes sure they all come
        before anyone blocks there, so a worker never waits for peers who went on to a newer world.
        """
        async with self._changed:
            arrived = self._arrived.setdefault(generation, set())
            arrived.add(worker_id)
            world = self._world
            if world is not None and world.generation == generation and {m.worker_id for m in world.members} <= arrived:
                self._complete.add(generation)
            self._changed.notify_all()

            def settled() -> bool:
                current = self._world
                return generation in self._complete or current is None or current.generation != generation

            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait_for(settled), timeout_s)
            if generation in self._complete:
                return True
            arrived.discard(worker_id)  # gone from this generation: it must not count as present
            return False

    async def newer_world(self, generation: int) -> tuple[str, ...] | None:
        """The member ids of the published world when it is newer than ``generation``; None when it is not."""
        world = self._world
        if world is None or world.generation <= generation:
            return None
        return tuple(m.worker_id for m in world.members)

    async def set_store(self, generation: int, host: str, port: int) -> None:
        """Rank 0 of a world tells where the world's TCPStore listens."""
        async with self._changed:
            self._stores[generation] = (host, port)
            self._changed.notify_all()

    async def get_store(self, generation: int, timeout_s: float) -> tuple[str, int] | None:
        async with self._changed:
            try:
                await asyncio.wait_for(self._changed.wait_for(lambda: generation in self._stores), timeout_s)
            except TimeoutError:
                return None
            return self._stores[generation]

    async def report_failure(self, worker_id: str, generation: int, reason: str) -> None:
        """A worker saw its group fail. A peer's death also reaches the driver through Ray; a failure without
        one (a formation that timed out, a collective that hung) reaches it only through this."""
        self._failures.append((worker_id, generation, reason))
