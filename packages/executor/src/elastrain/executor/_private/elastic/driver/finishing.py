"""How an elastic call ends well: which workers' results it returns, and when it has them all."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from elastrain.executor._private.elastic.driver.lifecycle import WorkerPhase
from elastrain.executor._private.elastic.driver.roster import Roster

logger = logging.getLogger("elastrain.executor")


@dataclass(frozen=True)
class Result:
    generation: int  # 0: the function never joined a group (it is not under elastic.run)
    rank: int
    value: object
    spawned_at: float
    worker_id: str


class Results:
    """The results of the workers that finished, and the members of each group published (whose results count)."""

    def __init__(self) -> None:
        self.finished: list[Result] = []
        self.members_by_generation: dict[int, frozenset[str]] = {}

    @property
    def generation(self) -> int | None:
        """The group of the first worker that finished; None while none has."""
        return self.finished[0].generation if self.finished else None

    def complete(self, roster: Roster) -> list[object] | None:
        """Once a worker finished in generation g, the call ends when every member of g has finished or is gone;
        its result is theirs, by rank. None while some are still running."""
        first = self.finished[0]
        if first.generation == 0:
            # A plain function joins no group: each worker that starts runs it once, and the call ends when none
            # is left running or starting. No ranks, so results come in the order workers were started.
            if any(w.counts for w in roster):
                return None
            return [f.value for f in sorted(self.finished, key=lambda f: f.spawned_at)]
        generation = first.generation
        members = self.members_by_generation.get(generation, frozenset())
        done = {f.worker_id for f in self.finished if f.generation == generation}
        if any(w.worker_id in members - done and w.phase is not WorkerPhase.STOPPING for w in roster):
            return None
        missing = members - done
        if missing:
            logger.warning(
                "Worker(s) %s of group %s ended without a result after the others finished; returning %s result(s).",
                ", ".join(sorted(missing)),
                generation,
                len(done),
            )
        ordered = sorted((f for f in self.finished if f.generation == generation), key=lambda f: f.rank)
        return [f.value for f in ordered]
