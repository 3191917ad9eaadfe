"""The actor that hosts one worker: it reports where it runs, takes its environment, and runs user functions."""

from __future__ import annotations

import contextlib
import gc
import importlib
import os
import socket
from collections.abc import Callable, Mapping
from typing import Any

from elastrain.executor._private.context import WorkerContext, _WorkerState
from elastrain.executor._private.messages import MessageSender
from elastrain.executor._private.node import NodeInfo
from elastrain.executor._private.versions import running_versions

# Before a call returns, the worker waits (this long at most) until the sink has every message it sent, so the
# driver's callbacks see them all before the call's result.
_FLUSH_TIMEOUT_S = 10.0


class Worker:
    """Ray actor class (created by the executor with the worker's resources and placement)."""

    def __init__(self) -> None:
        self._executable: Any = None
        self._sink: Any = None
        self._sender = MessageSender()
        self._call_id = 0  # > 0 while a call whose callbacks want messages runs; 0 drops send()s
        self._sender_id = ""  # elastic workers change rank, so their messages are ordered by worker id
        self._sequence = 0

    def node_info(self) -> NodeInfo:
        import ray

        return NodeInfo(
            node_id=ray.get_runtime_context().get_node_id(),
            node_ip=ray.util.get_node_ip_address(),
            hostname=socket.gethostname(),
            pid=os.getpid(),
            gpu_ids=tuple(str(gpu) for gpu in ray.get_gpu_ids()),
            versions=running_versions(),
        )

    def alive(self) -> bool:
        """Answers from the actor's "control" thread (elastic workers), even while the job's function runs."""
        return True

    def prepare(self, modules: tuple[str, ...], head_starts: tuple[str, ...] = ()) -> NodeInfo:
        """Import ``modules`` (an ImportError fails the worker's start) and, where they import, ``head_starts``;
        then say where this worker runs. Always a worker's first call.

        Elastic workers import torch here, before joining, so a new worker never holds up a running group; the
        head start is torch._dynamo (~1 s here), which torch imports when the first optimizer or
        DistributedDataParallel is built, after the newcomer joined, while the group waits. Static workers
        import nothing. The argument matters beyond that: Ray 2.60 delivers the result of an actor's first call
        85-140 ms late when neither the call nor the actor's creation had arguments (under 1 ms otherwise).
        """
        if modules or head_starts:
            _import_long_lived(modules, head_starts)
        return self.node_info()

    def run_elastic(
        self,
        call: bytes,
        call_id: int,
        worker_id: str,
        coordinator: Any,
        options: Any,
        sink: Any,
    ) -> tuple[int, int, Any] | None:
        """Run an elastic job's function; ``(generation, rank, result)``, or ``None`` when left out of a group."""
        from elastrain.executor._private.elastic.worker import runtime

        node = self.node_info()
        _WorkerState.context = WorkerContext(
            rank=-1, size=0, local_rank=-1, local_size=0, cross_rank=-1, cross_size=0, node_rank=-1,
            num_nodes=0, node_id=node.node_id, node_ip=node.node_ip, hostname=node.hostname, pid=node.pid,
            gpu_ids=node.gpu_ids, visible_gpu_ids=node.gpu_ids, backend="torch", run_id=worker_id,
        )  # fmt: skip
        _WorkerState.sender = self._send
        self._sink = sink
        self._sender_id = worker_id
        job = runtime.Runtime(coordinator, worker_id, options)
        runtime.install(job)
        self._begin(call_id)
        try:
            job.start()
            fn, args, kwargs = _unpack(call)
            value = fn(*args, **kwargs)
            member = job.member
            return (job.generation, member.slot.rank if member else 0, value)
        except runtime.WorkerRemoved:
            return None
        finally:
            self._flush_messages()
            job.close()
            runtime.install(None)

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run a backend's set-up helper here."""
        return fn()

    def setup(
        self,
        env: Mapping[str, str],
        context: WorkerContext,
        sink: Any,
        executable_cls: type | None,
        executable_args: tuple[Any, ...],
        executable_kwargs: Mapping[str, Any],
    ) -> None:
        os.environ.update(env)
        _WorkerState.context = context
        _WorkerState.sender = self._send
        self._sink = sink
        if executable_cls is not None:
            self._executable = executable_cls(*executable_args, **executable_kwargs)

    def run(self, call: bytes, call_id: int, sink: Any = None) -> Any:
        """``sink``: the message actor, passed with every call whose callbacks want messages."""
        fn, args, kwargs = _unpack(call)
        self._begin(call_id, sink)
        try:
            return fn(*args, **kwargs)
        finally:
            self._flush_messages()

    def execute(self, call: bytes | Callable[[Any], Any], call_id: int, sink: Any = None) -> Any:
        fn = _unpack(call) if isinstance(call, bytes) else call
        self._begin(call_id, sink)
        try:
            return fn(self._executable)
        finally:
            self._flush_messages()

    def _begin(self, call_id: int, sink: Any = None) -> None:
        """``call_id`` > 0 identifies a call whose callbacks want this worker's messages; 0 drops them."""
        self._call_id, self._sequence = call_id, 0
        if sink is not None:
            self._sink = sink

    def _send(self, message: dict[str, Any]) -> None:
        context = _WorkerState.context
        if self._call_id == 0 or context is None:
            return
        envelope = (self._call_id, self._sender_id or str(context.rank), self._sequence, message)
        self._sequence += 1
        self._sender.send(self._sink, envelope)

    def _flush_messages(self) -> None:
        self._sender.flush(_FLUSH_TIMEOUT_S)


def _import_long_lived(modules: tuple[str, ...], head_starts: tuple[str, ...]) -> None:
    """Import modules that stay for the life of the process, with the cyclic collector paused.

    torch and torch._dynamo create about a million objects; each full collection during the import walks all of
    them again (four collections, 0.3 s of a 1.9 s import here). Afterwards they are frozen, so the training
    loop's own full collections skip them too. What the import left as garbage stays: a few cycles at most.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        for module in modules:
            importlib.import_module(module)
        for module in head_starts:
            with contextlib.suppress(Exception):  # only a head start: torch imports it itself when needed
                importlib.import_module(module)
    finally:
        if enabled:
            gc.enable()
    gc.freeze()


def _unpack(call: bytes) -> Any:
    from ray import cloudpickle

    return cloudpickle.loads(call)
