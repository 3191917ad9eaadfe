"""Elastic jobs on the horovod backend: Horovod's own elastic machinery, set up so that it works out of the box.

Horovod's elastic Ray executor drives ``hvd.elastic.run`` code (its rendezvous, notifications and resets); this
session hands it elastrain's discovery, picks the loopback interface on a single machine (where Horovod
otherwise hangs), and lets the workers' ``elastrain.executor.send()`` reach the driver's callbacks.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from elastrain.executor._private.context import _WorkerState
from elastrain.executor._private.elastic.driver.session import discovery_for
from elastrain.executor._private.messages import Callback, MessageSink, delivering
from elastrain.executor._private.options import ExecutorOptions
from elastrain.executor._private.placement import control_actor_options
from elastrain.executor._private.settings import ExecutorSettings

_CALLBACK_DRAIN_S = 10.0
_FLUSH_TIMEOUT_S = 10.0


def single_machine() -> bool:
    """Whether every alive Ray node has the driver's address (one machine, or ``ray.cluster_utils.Cluster``)."""
    import ray

    driver_ip = ray.util.get_node_ip_address()
    return all(node["NodeManagerAddress"] == driver_ip for node in ray.nodes() if node.get("Alive"))


class _Sender:
    """Installed in a Horovod worker for one call: ``send()`` goes to the executor's message sink."""

    def __init__(self, sink: Any, call_id: int) -> None:
        self.sink = sink
        self.call_id = call_id
        self.sender_id = f"pid{os.getpid()}"
        self.sequence = 0
        self.outstanding: list[Any] = []

    def __call__(self, message: dict[str, Any]) -> None:
        self.outstanding.append(self.sink.put.remote((self.call_id, self.sender_id, self.sequence, message)))
        self.sequence += 1

    def flush(self) -> None:
        import ray

        if self.outstanding:
            ray.wait(self.outstanding, num_returns=len(self.outstanding), timeout=_FLUSH_TIMEOUT_S)


def _with_messages(
    fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], sink: Any, call_id: int
) -> Callable[[], Any]:
    def call_in_worker() -> Any:
        sender = _Sender(sink, call_id) if call_id else None
        _WorkerState.sender = sender
        try:
            return fn(*args, **kwargs)
        finally:
            _WorkerState.sender = None
            if sender is not None:
                sender.flush()

    return call_in_worker


class HorovodElasticSession:
    def __init__(
        self, options: ExecutorOptions, settings: ExecutorSettings, env_vars: dict[str, str] | None = None
    ) -> None:
        import ray
        from horovod.ray import RayExecutor as HorovodRayExecutor

        nics = settings.nics or ({"lo"} if single_machine() else None)
        horovod_settings = HorovodRayExecutor.create_settings(
            timeout_s=settings.timeout_s, placement_group_timeout_s=settings.placement_group_timeout_s, nics=nics
        )
        if not options.override_discovery:
            horovod_settings.discovery = discovery_for(options, settings)
        self.executor = HorovodRayExecutor(
            horovod_settings,
            min_workers=options.min_workers,
            max_workers=options.max_workers,
            reset_limit=options.reset_limit,
            cooldown_range=options.cooldown_range,
            elastic_timeout=options.elastic_timeout,
            override_discovery=options.override_discovery,
            cpus_per_worker=options.cpus_per_worker,
            use_gpu=options.use_gpu,
            gpus_per_worker=options.gpus_per_worker or None,
        )
        self.executor.start(extra_env_vars=env_vars or None)
        self.sink: Any = ray.remote(MessageSink).options(**control_actor_options()).remote()
        self.calls = 0

    def run(
        self,
        fn: Callable[..., Any],
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
        callbacks: list[Callback],
        run_id: str | None = None,  # Horovod's own elastic loop runs untracked
    ) -> list[Any]:
        self.calls += 1
        call_id = self.calls if callbacks else 0
        with delivering(self.sink, callbacks, call_id, _CALLBACK_DRAIN_S):
            return list(self.executor.run(_with_messages(fn, tuple(args), dict(kwargs), self.sink, call_id)))

    def shutdown(self) -> None:
        import ray

        rendezvous = getattr(getattr(self.executor, "adapter", None), "rendezvous", None)
        self.executor.shutdown()
        # Horovod stops its rendezvous server without closing the listening socket; close it here.
        httpd = getattr(rendezvous, "_httpd", None)
        if httpd is not None:
            httpd.server_close()
        ray.kill(self.sink, no_restart=True)
