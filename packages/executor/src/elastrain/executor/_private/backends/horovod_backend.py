"""The Horovod backend: Horovod's gloo rendezvous and rank variables, so ``hvd.init()`` works as under Horovod."""

from __future__ import annotations

import fcntl
import importlib.util
import socket
import struct
from collections.abc import Sequence
from typing import Any

from elastrain.executor._private.backends.base import Backend, WorkerGroup
from elastrain.executor._private.placement import WorkerPlacement
from elastrain.executor._private.settings import ExecutorSettings

_SIOCGIFADDR = 0x8915  # Linux ioctl: an interface's IPv4 address


def require_horovod() -> None:
    if importlib.util.find_spec("horovod") is None:
        raise ImportError(
            "backend='horovod' needs Horovod: pip install 'elastrain-executor[horovod]' "
            "(Horovod builds from source; see the executor's README for the build settings)."
        )


def interface_with_address(ip: str) -> str | None:
    """The name of this host's network interface that holds ``ip``, if any."""
    for _, name in socket.if_nameindex():
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            try:
                packed = fcntl.ioctl(probe.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue
        if socket.inet_ntoa(packed[20:24]) == ip:
            return name
    return None


class HorovodBackend(Backend):
    """Starts Horovod's rendezvous server on the driver and gives each worker Horovod's variables.

    Without ``nics`` each worker uses the interface that holds its node's IP (``lo`` when that is a loopback
    address), so a single machine needs no setting.
    """

    name = "horovod"

    def __init__(self) -> None:
        require_horovod()
        self._server: Any = None

    def worker_env(
        self, placements: Sequence[WorkerPlacement], group: WorkerGroup, settings: ExecutorSettings, run_id: str
    ) -> list[dict[str, str]]:
        import ray
        from horovod.runner.common.util.hosts import SlotInfo
        from horovod.runner.http.http_server import RendezvousServer

        plan = [
            SlotInfo(
                hostname=p.node.node_id,
                rank=p.slot.rank,
                local_rank=p.slot.local_rank,
                cross_rank=p.slot.cross_rank,
                size=p.slot.size,
                local_size=p.slot.local_size,
                cross_size=p.slot.cross_size,
            )
            for p in placements
        ]
        self._server = RendezvousServer(verbose=settings.verbose)
        port = self._server.start()
        self._server.init(plan)
        driver_ip = ray.util.get_node_ip_address()
        envs = []
        for placement in placements:
            interfaces = sorted(settings.nics) if settings.nics else [self._interface(placement, group)]
            slot = placement.slot
            env = {
                "HOROVOD_GLOO_RENDEZVOUS_ADDR": driver_ip,
                "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port),
                "HOROVOD_CONTROLLER": "gloo",
                "HOROVOD_CPU_OPERATIONS": "gloo",
                "HOROVOD_GLOO_IFACE": interfaces[0],
                "NCCL_SOCKET_IFNAME": ",".join(interfaces),
                "HOROVOD_HOSTNAME": placement.node.node_id,
                "HOROVOD_RANK": str(slot.rank),
                "HOROVOD_SIZE": str(slot.size),
                "HOROVOD_LOCAL_RANK": str(slot.local_rank),
                "HOROVOD_LOCAL_SIZE": str(slot.local_size),
                "HOROVOD_CROSS_RANK": str(slot.cross_rank),
                "HOROVOD_CROSS_SIZE": str(slot.cross_size),
            }
            if placement.visible_gpu_ids:
                env["CUDA_VISIBLE_DEVICES"] = ",".join(placement.visible_gpu_ids)
            envs.append(env)
        return envs

    @staticmethod
    def _interface(placement: WorkerPlacement, group: WorkerGroup) -> str:
        ip = placement.node.node_ip
        found = group.call(placement.rank, lambda: interface_with_address(ip))
        if found is None:
            raise RuntimeError(
                f"No network interface on node {placement.node.node_id} holds its Ray address {ip}; pass "
                "nics={'<interface>'} to RayExecutor.create_settings()."
            )
        return str(found)

    def shutdown(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.stop()
            # Horovod's stop() leaves the listening socket open; close it so it does not leak.
            httpd = getattr(server, "_httpd", None)
            if httpd is not None:
                httpd.server_close()
