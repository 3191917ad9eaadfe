"""The default backend: torchrun's environment, so ``torch.distributed.init_process_group()`` just works."""

from __future__ import annotations

import socket
from collections.abc import Sequence

from elastrain.executor._private.backends.base import Backend, WorkerGroup
from elastrain.executor._private.placement import WorkerPlacement
from elastrain.executor._private.settings import ExecutorSettings


def free_port() -> int:
    """A TCP port that is free on this host now (torchrun picks its master port the same way)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("", 0))
        return int(probe.getsockname()[1])


class TorchBackend(Backend):
    """Sets the variables torchrun sets, with rank 0's node as the rendezvous master.

    Code written for torchrun (``init_process_group()`` with the default ``env://``) runs unchanged;
    :func:`elastrain.executor.init_process_group` does it with the right backend for CPU or GPU.
    """

    name = "torch"

    def worker_env(
        self, placements: Sequence[WorkerPlacement], group: WorkerGroup, settings: ExecutorSettings, run_id: str
    ) -> list[dict[str, str]]:
        master = placements[0]
        master_port = group.call(0, free_port)
        envs = []
        for placement in placements:
            slot = placement.slot
            env = {
                "MASTER_ADDR": master.node.node_ip,
                "MASTER_PORT": str(master_port),
                "RANK": str(slot.rank),
                "WORLD_SIZE": str(slot.size),
                "LOCAL_RANK": str(slot.local_rank),
                "LOCAL_WORLD_SIZE": str(slot.local_size),
                "GROUP_RANK": str(placement.node_rank),
                "GROUP_WORLD_SIZE": str(placement.num_nodes),
                "ROLE_NAME": "default",
                "ROLE_RANK": str(slot.rank),
                "ROLE_WORLD_SIZE": str(slot.size),
                "TORCHELASTIC_RUN_ID": run_id,
                "TORCHELASTIC_RESTART_COUNT": "0",
                "TORCHELASTIC_MAX_RESTARTS": "0",
            }
            if placement.visible_gpu_ids:
                env["CUDA_VISIBLE_DEVICES"] = ",".join(placement.visible_gpu_ids)
            if settings.nics:
                interfaces = ",".join(sorted(settings.nics))
                env["GLOO_SOCKET_IFNAME"] = interfaces
                env["NCCL_SOCKET_IFNAME"] = interfaces
            envs.append(env)
        return envs
