"""In-memory redundancy of a sharded state: each rank keeps a copy of its ward's committed chunks.

The ranks of a world form a ring: rank ``r`` sends its committed copy to its buddy ``(r + shift) % size`` and
keeps its ward's, ``(r - shift) % size``. The shift puts the buddy on another node wherever the world allows it
(:func:`~.shard_plan.ring_shift`). A commit posts the exchange on a group of its own and returns at once, so the
copy travels while training goes on (as in Gemini); the next commit waits for it, and one tiny all-reduce then
tells every rank that every copy of that version arrived. Only then does a rank let go of its older copy, so at
any moment some version is whole in memory: each chunk held by its owner or by the owner's buddy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from elastrain.executor._private.elastic.worker.collectives import side_group
from elastrain.executor._private.elastic.worker.shard_copies import Copy, Layout
from elastrain.executor._private.elastic.worker.shard_plan import ring_shift

# How long after a world's end a ward copy still arriving may take. A receive from a peer that died fails within tens
# of milliseconds (gloo sees the connection close), and one from a live peer is usually done: the wait is short
# either way, and buys the newest version instead of the one before.
_ARRIVAL_WAIT_S = 0.5


@dataclass
class _Exchange:
    version: int
    ward_copy: Copy
    works: list[Any]
    waited: bool = False  # a gloo point-to-point work waited for once never returns from a second wait


class Redundancy:
    """One rank's side of the ring for one world (``every``: exchange at every n-th commit; 0 turns it off)."""

    def __init__(self, every: int) -> None:
        self.every = every
        self.group: Any = None
        self.buddy = self.ward = -1
        self._ward_layout: Layout | None = None
        self._announced: Layout | None = None
        self._in_flight: _Exchange | None = None
        self._confirmed: Copy | None = None
        self._spare: Any = None  # a ward buffer no longer needed, reused by the next exchange
        self._frozen: list[Copy] = []  # ward copies kept across a reset, until the sync used them
        self._arriving: _Exchange | None = None  # the exchange in flight when the world ended
        self._arrival_deadline = 0.0

    # -- a world's ring ---------------------------------------------------------------------------------------

    def start_world(self, rank: int, size: int, nodes: list[Any], layouts: list[dict[str, Any]]) -> None:
        """Join the new world's ring (a collective: every member calls it, right after the sync)."""

        self._frozen, self._arriving = [], None
        if self.every <= 0 or size < 2:
            return
        # A group of its own: its transfers run on their own connections, beside training's collectives.
        self.group = side_group()
        shift = ring_shift(nodes)
        self.buddy, self.ward = (rank + shift) % size, (rank - shift) % size
        self._ward_layout = Layout(layouts[self.ward])
        self._announced = Layout(layouts[rank])

    def freeze(self) -> None:
        """The world ends (before its group closes): keep the confirmed ward copy, and the one in flight until
        :meth:`ward_copies` knows whether it arrived whole. Never waits: the world's group is freed sooner, and
        peers still waiting on this rank in its collectives fail sooner."""
        import time

        self._frozen = [] if self._confirmed is None else [self._confirmed]
        self._arriving = self._in_flight
        self._arrival_deadline = time.monotonic() + _ARRIVAL_WAIT_S
        self.group, self._in_flight, self._confirmed, self._spare = None, None, None, None
        self.buddy = self.ward = -1

    # -- commits ----------------------------------------------------------------------------------------------

    def kept_versions(self) -> set[int]:
        """Versions of this rank's own copies the ring still needs (sent, or the one its ward copy matches)."""
        kept = set()
        if self._confirmed is not None:
            kept.add(self._confirmed.version)
        if self._in_flight is not None:
            kept.add(self._in_flight.version)
        return kept

    def ward_copies(self) -> list[Copy]:
        """The ward copies this rank can offer at a reset (a copy still arriving when the world ended counts if it
        arrives whole by a short deadline)."""
        import time

        exchange, self._arriving = self._arriving, None
        if exchange is not None and (
            exchange.waited or _arrived(exchange.works[1], self._arrival_deadline - time.monotonic())
        ):
            self._frozen.append(exchange.ward_copy)
        return list(self._frozen)

    def due(self, commits: int) -> bool:
        return self.group is not None and commits % self.every == 0

    def before_save(self) -> None:
        """At a commit: wait for the exchange in flight (each rank for its own send and receive)."""
        exchange = self._in_flight
        if exchange is not None and not exchange.waited:
            for work in exchange.works:
                work.wait()
            exchange.waited = True

    def after_save(self, own: Copy, due: bool) -> None:
        """At a commit, after ``own`` was saved: confirm the previous exchange everywhere, then send ``own`` if
        this commit is due. One all-reduce over the ring's group carries both the confirmation and whether any
        rank's layout changed (an optimizer's state appears at its first step)."""
        import torch
        import torch.distributed as dist

        if self.group is None or (self._in_flight is None and not due):
            return
        changed = int(due and own.layout != self._announced)
        flags = torch.tensor([changed], dtype=torch.int64)
        dist.all_reduce(flags, group=self.group)
        if self._in_flight is not None:  # every rank waited for it before this all-reduce: it is whole everywhere
            previous, self._confirmed = self._confirmed, self._in_flight.ward_copy
            self._in_flight = None
            if previous is not None and previous.layout == self._ward_layout:
                self._spare = previous.buffer
        if not due:
            return
        if int(flags.item()):
            from elastrain.executor._private.elastic.worker.collectives import all_gather_object

            layouts = all_gather_object(own.layout.describe(), group=self.group)
            self._announced, self._ward_layout = own.layout, Layout(layouts[self.ward])
            self._spare = None
        self._post(own)

    def send_now(self, own: Copy) -> None:
        """Right after a sync: send the copy the world just loaded, so a failure before its first commit still
        finds every chunk twice."""
        if self.group is not None:
            self._post(own)

    def _post(self, own: Copy) -> None:
        import torch.distributed as dist

        if self._ward_layout is None:
            raise RuntimeError("The ring has no ward layout: start_world() runs first.")
        buffer = self._spare if self._spare is not None else self._ward_layout.allocate()
        self._spare = None
        ward_copy = Copy(own.version, own.commits, self._ward_layout, buffer)
        works = [
            dist.isend(own.buffer, self.buddy, group=self.group),
            dist.irecv(buffer, self.ward, group=self.group),
        ]
        self._in_flight = _Exchange(own.version, ward_copy, works)

    def memory_bytes(self) -> int:
        """CPU memory this rank's ward copies take."""
        copies = [*self._frozen]
        if self._confirmed is not None:
            copies.append(self._confirmed)
        if self._in_flight is not None:
            copies.append(self._in_flight.ward_copy)
        return sum(int(c.buffer.numel()) for c in copies)


def _arrived(work: Any, wait_s: float) -> bool:
    """Whether a receive completed whole, waiting for it at most ``wait_s`` (gloo's point-to-point works report
    completion only through ``wait``)."""
    import datetime

    try:
        work.wait(timeout=datetime.timedelta(seconds=max(wait_s, 0.001)))
    except Exception:  # timed out, or its sender died: it brought nothing
        return False
    return True
