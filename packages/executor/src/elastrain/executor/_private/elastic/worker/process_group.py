"""One world's torch process group, owned by one object: its TCPStore, its forming, and how it is left.

A world's group lives from the moment every member arrived until the worker leaves for the next world. Rank 0
opens the store and tells the rendezvous actor where it listens; the others connect to it. Leaving never waits
on peers: an NCCL group is aborted first (destroying a communicator whose peer is gone can hang), and a gloo
group whose peers died is dropped whether or not it shuts down cleanly.
"""

from __future__ import annotations

import contextlib
import datetime
from typing import Any

from elastrain.executor._private.elastic.coordinator import CONTROL_TIMEOUT_S


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
            found = ray.get(
                coordinator.get_store.remote(self.generation, formation_timeout_s),
                timeout=formation_timeout_s + CONTROL_TIMEOUT_S,
            )
            if found is None:
                raise TimeoutError(f"Rank 0 of group {self.generation} never published its store.")
            master = (found[0], int(found[1]))
            self._store = dist.TCPStore(  # type: ignore[attr-defined]
                master[0], master[1], self.size, is_master=False, timeout=timeout
            )
        dist.init_process_group(
            backend,
            store=self._store,
            rank=self.rank,
            world_size=self.size,
            timeout=datetime.timedelta(seconds=collective_timeout_s),
        )
        self.master = master
        return master

    def close(self) -> None:
        """Leave the group without waiting on its peers (they may be dead or stuck)."""
        close_default_group()
        self._store = None


def close_default_group() -> None:
    """Abort (NCCL) and destroy the default group, if any, never raising."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return
    if dist.get_backend() == "nccl":
        with contextlib.suppress(Exception):
            dist.distributed_c10d._abort_process_group()
    with contextlib.suppress(Exception):
        dist.destroy_process_group()
