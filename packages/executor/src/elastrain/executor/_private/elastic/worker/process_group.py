"""One world's torch process group, owned by one object: its TCPStore, its forming, and how it is left.

A world's group lives from the moment every member arrived until the worker leaves for the next world. Rank 0
opens the store and tells the rendezvous actor where it listens; the others connect to it. Leaving never waits
on peers: an NCCL group is aborted first (destroying a communicator whose peer is gone can hang), and a gloo
group whose peers died is dropped whether or not it shuts down cleanly.

Forming can be given up. A member that dies or freezes between its arrival and the group's forming would leave
the others blocked in ``init_process_group`` (which no one can interrupt) for the whole collective timeout. So
every member first meets the others on the store, polling, and gives up as soon as the driver has published a
newer world (it does, once it knows that member is gone); ``init_process_group`` starts only when all are there,
and then takes milliseconds.
"""

from __future__ import annotations

import contextlib
import datetime
import sys
import time
from typing import Any

from elastrain.executor._private.elastic.coordinator import CONTROL_TIMEOUT_S
from elastrain.executor._private.errors import first_line

# How often a forming member asks the rendezvous actor whether its world was replaced, while it meets the others
# on the store.
_REPLACED_POLL_S = 0.1
# One wait for rank 0's store address; the rendezvous actor answers at once when the world is replaced.
_STORE_WAIT_S = 5.0
_MEMBERS_KEY = "elastrain/members"


class ProcessGroup:
    """The default torch process group of world ``generation``, formed by :meth:`form` and ended by :meth:`close`."""

    def __init__(self, generation: int, rank: int, size: int) -> None:
        self.generation, self.rank, self.size = generation, rank, size
        self.master: tuple[str, int] | None = None  # where the world's store listens, once formed
        self._store: Any = None

    def form(
        self, coordinator: Any, backend: str, formation_timeout_s: float, collective_timeout_s: float
    ) -> tuple[str, int]:
        """Open or reach the world's store, then form the group on it; returns the store's address."""
        import ray
        import torch.distributed as dist

        timeout = datetime.timedelta(seconds=formation_timeout_s)
        if self.rank == 0:
            host = ray.util.get_node_ip_address()
            self._store = dist.TCPStore(  # type: ignore[attr-defined]
                host, 0, self.size, is_master=True, wait_for_workers=False, timeout=timeout
            )
            master = (host, int(self._store.port))
            ray.get(coordinator.set_store.remote(self.generation, *master), timeout=CONTROL_TIMEOUT_S)
        else:
            master = self._wait_for_store(coordinator, formation_timeout_s)
            self._store = dist.TCPStore(  # type: ignore[attr-defined]
                master[0], master[1], self.size, is_master=False, timeout=timeout
            )
        self._meet(coordinator, formation_timeout_s)
        dist.init_process_group(
            backend,
            store=self._store,
            rank=self.rank,
            world_size=self.size,
            timeout=datetime.timedelta(seconds=collective_timeout_s),
        )
        self.master = master
        return master

    def _wait_for_store(self, coordinator: Any, formation_timeout_s: float) -> tuple[str, int]:
        """Where rank 0's store listens, once it said; gives up when the world is replaced (rank 0 may be gone)."""
        import ray

        deadline = time.monotonic() + formation_timeout_s
        while True:
            wait_s = max(min(_STORE_WAIT_S, deadline - time.monotonic()), 0.0)
            found = ray.get(coordinator.get_store.remote(self.generation, wait_s), timeout=wait_s + CONTROL_TIMEOUT_S)
            if found is not None:
                return (found[0], int(found[1]))
            if time.monotonic() >= deadline:
                raise TimeoutError(f"Rank 0 of group {self.generation} never published its store.")
            self._give_up_if_replaced(coordinator)

    def _meet(self, coordinator: Any, formation_timeout_s: float) -> None:
        """Wait on the store until every member reached it, giving up when the world is replaced."""
        deadline = time.monotonic() + formation_timeout_s
        next_check = time.monotonic() + _REPLACED_POLL_S
        pause = 0.001
        try:
            count = self._store.add(_MEMBERS_KEY, 1)
            while count < self.size:
                now = time.monotonic()
                if now >= deadline:
                    raise TimeoutError(
                        f"Only {count} of group {self.generation}'s {self.size} members reached its store within "
                        f"{formation_timeout_s:g} s."
                    )
                if now >= next_check:
                    self._give_up_if_replaced(coordinator)
                    next_check = now + _REPLACED_POLL_S
                time.sleep(pause)
                pause = min(2 * pause, 0.02)
                count = self._store.add(_MEMBERS_KEY, 0)
        except RuntimeError as error:  # the store's host (rank 0) went away
            raise TimeoutError(f"Group {self.generation}'s store failed while it formed: {first_line(error)}") from None

    def _give_up_if_replaced(self, coordinator: Any) -> None:
        import ray

        if ray.get(coordinator.newer_world.remote(self.generation), timeout=CONTROL_TIMEOUT_S) is not None:
            raise TimeoutError(f"Group {self.generation} was replaced while it formed (a member is gone).")

    def close(self) -> None:
        """Leave the group without waiting on its peers (they may be dead or stuck)."""
        close_default_group()
        self._store = None


def close_default_group() -> None:
    """Abort (NCCL) and destroy the default group, if any, never raising."""
    if "torch.distributed" not in sys.modules:
        return  # no group can exist; importing torch only to learn that costs seconds
    import torch.distributed as dist

    if not dist.is_initialized():
        return
    if dist.get_backend() == "nccl":
        with contextlib.suppress(Exception):
            dist.distributed_c10d._abort_process_group()
    with contextlib.suppress(Exception):
        dist.destroy_process_group()
