"""RayExecutor: runs a distributed function on a group of Ray actors, with Horovod's RayExecutor API."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any

from elastrain.executor._private.backends.base import Backend, resolve_backend
from elastrain.executor._private.calls import WorkerCalls
from elastrain.executor._private.context import WorkerContext
from elastrain.executor._private.elastic.driver.session import ElasticSession

if TYPE_CHECKING:
    from elastrain.executor._private.elastic.driver.horovod_session import HorovodElasticSession
from elastrain.executor._private.errors import (
    ExecutorNotStartedError,
    VersionMismatchError,
    WorkerDiedError,
    WorkerError,
)
from elastrain.executor._private.messages import Callback, MessageSink, delivering
from elastrain.executor._private.node import NodeInfo
from elastrain.executor._private.observers import RunWatch, exception_line, run_name, run_record, worker_record
from elastrain.executor._private.options import ExecutorOptions, check_options
from elastrain.executor._private.placement import (
    WorkerPlacement,
    assign_ranks,
    control_actor_options,
    plan_placement,
    reserve,
    wait_ready,
)
from elastrain.executor._private.settings import ExecutorSettings, create_settings
from elastrain.executor._private.versions import mismatch, running_versions
from elastrain.executor._private.worker import Worker

# How long callback delivery may take to drain after a call's results are in.
_CALLBACK_DRAIN_S = 10.0


class RayExecutor:
    """Runs a function on ``num_workers`` Ray actors that form one distributed group.

    Static jobs: ``num_workers`` (packed onto as few nodes as fit), or ``num_hosts`` × ``num_workers_per_host``
    (one node per host). Elastic jobs (``min_workers``/``max_workers``) are accepted for API compatibility;
    see :meth:`start`. ``backend`` is ``"torch"`` (default), ``"horovod"`` (extra ``elastrain-executor[horovod]``)
    or a :class:`~elastrain.executor.Backend`.

    ``size_multiple`` (elastic jobs): every group the job forms has a whole multiple of this many workers, and
    ``min_workers``/``max_workers`` are multiples of it too. It is the shard size of an HSDP mesh: when a worker
    dies, the group goes on with the untouched blocks of ``size_multiple`` consecutive ranks (replica groups),
    and the dead worker's block-mates wait, alive, until replacements make their block whole again.
    """

    create_settings = staticmethod(create_settings)

    def __init__(
        self,
        settings: ExecutorSettings | None = None,
        num_workers: int | None = None,
        num_hosts: int | None = None,
        num_workers_per_host: int = 1,
        cpus_per_worker: float = 1,
        use_gpu: bool = False,
        gpus_per_worker: float | None = None,
        use_current_placement_group: bool = True,
        min_workers: int | None = None,
        max_workers: int | None = None,
        reset_limit: int | None = None,
        cooldown_range: tuple[float, float] | None = None,
        elastic_timeout: float = 600,
        override_discovery: bool = True,
        backend: str | Backend = "torch",
        size_multiple: int = 1,
    ) -> None:
        self.settings = settings if settings is not None else create_settings()
        self.options: ExecutorOptions = check_options(
            settings=self.settings,
            num_workers=num_workers,
            num_hosts=num_hosts,
            num_workers_per_host=num_workers_per_host,
            cpus_per_worker=cpus_per_worker,
            use_gpu=use_gpu,
            gpus_per_worker=gpus_per_worker,
            use_current_placement_group=use_current_placement_group,
            min_workers=min_workers,
            max_workers=max_workers,
            reset_limit=reset_limit,
            cooldown_range=cooldown_range,
            elastic_timeout=elastic_timeout,
            override_discovery=override_discovery,
            size_multiple=size_multiple,
        )
        self.backend = resolve_backend(backend)
        if self.backend.name == "horovod" and self.options.size_multiple != 1:
            raise ValueError(
                "size_multiple needs elastrain's own elastic driver; Horovod's elastic driver forms groups of any "
                'size: use backend="torch", or drop size_multiple.'
            )
        self._calls: WorkerCalls | None = None
        self._placements: list[WorkerPlacement] = []
        self._placement_group: Any = None
        self._own_placement_group = False
        self._sink: Any = None
        self._calls_with_callbacks = 0
        self._elastic: ElasticSession | HorovodElasticSession | None = None
        self.run_id = ""
        self._last_run_id: str | None = None

    # -- properties ------------------------------------------------------------------------------------------

    @property
    def num_workers(self) -> int:
        return self.options.num_workers

    @property
    def started(self) -> bool:
        return self._calls is not None or self._elastic is not None

    @property
    def last_run_id(self) -> str | None:
        """The id the latest ``run``/``execute`` call is recorded by in run tracking (elastrain-state and the
        dashboard's ``/api/train/runs/{id}``): set as soon as the call starts; None before the first call and
        for elastic jobs on the horovod backend, which run untracked. Not :attr:`run_id`, which names the worker
        group of one ``start()`` for the collective backend."""
        return self._last_run_id

    @property
    def placements(self) -> list[WorkerPlacement]:
        """Each worker's ranks and node, by rank (empty before :meth:`start`)."""
        return list(self._placements)

    # -- lifecycle -------------------------------------------------------------------------------------------

    def start(
        self,
        executable_cls: type | None = None,
        executable_args: Sequence[Any] | None = None,
        executable_kwargs: Mapping[str, Any] | None = None,
        extra_env_vars: Mapping[str, str] | None = None,
    ) -> None:
        """Place the workers, start one actor per worker and set up the backend.

        With ``executable_cls``, each worker builds one instance (``executable_cls(*args, **kwargs)``) that
        :meth:`execute` passes to its function, so state persists across calls. ``extra_env_vars`` are set in
        every worker after the backend's variables.
        """
        if self.started:
            raise RuntimeError("This executor is already started; call shutdown() before starting it again.")
        env_vars = _check_env_vars(extra_env_vars)
        if self.options.elastic:
            if executable_cls is not None:
                raise NotImplementedError("Elastic jobs take no executable_cls; pass the function to run().")
            if self.backend.name == "horovod":
                from elastrain.executor._private.elastic.driver.horovod_session import HorovodElasticSession

                self._elastic = HorovodElasticSession(self.options, self.settings, env_vars)
            else:
                self._elastic = ElasticSession(self.options, self.settings, env_vars)
            return
        import ray

        self.run_id = uuid.uuid4().hex
        try:
            self._start(ray, executable_cls, tuple(executable_args or ()), dict(executable_kwargs or {}), env_vars)
        except BaseException:
            self.shutdown()
            raise
        self._message_sink()  # started now, without waiting: off the workers' start-up, ready for callbacks

    def _start(
        self,
        ray: Any,
        executable_cls: type | None,
        executable_args: tuple[Any, ...],
        executable_kwargs: dict[str, Any],
        extra_env_vars: dict[str, str],
    ) -> None:
        from ray.util.placement_group import get_current_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        options = self.options
        plan = plan_placement(
            num_workers=options.num_workers if options.num_hosts is None else None,
            num_hosts=options.num_hosts,
            num_workers_per_host=options.num_workers_per_host,
            cpus_per_worker=options.cpus_per_worker,
            gpus_per_worker=options.gpus_per_worker,
        )
        current = get_current_placement_group() if options.use_current_placement_group else None
        if current is not None:
            self._placement_group, self._own_placement_group = current, False
        else:
            self._placement_group = reserve(plan, self.settings.placement_group_timeout_s)
            self._own_placement_group = True

        worker_class = ray.remote(Worker)
        actors = [
            worker_class.options(
                num_cpus=options.cpus_per_worker,
                num_gpus=options.gpus_per_worker,
                max_restarts=0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=self._placement_group,
                    # In a caller's group, any bundle with room: its bundles were not shaped for these workers.
                    placement_group_bundle_index=bundle if self._own_placement_group else -1,
                ),
            ).remote()
            for bundle in plan.bundle_of_worker
        ]
        try:
            self._calls = self._set_up(actors, executable_cls, executable_args, executable_kwargs, extra_env_vars)
        except BaseException:
            for actor in actors:  # not yet known to shutdown(): release them here
                ray.kill(actor, no_restart=True)
            raise

    def _set_up(
        self,
        actors: list[Any],
        executable_cls: type | None,
        executable_args: tuple[Any, ...],
        executable_kwargs: dict[str, Any],
        extra_env_vars: dict[str, str],
    ) -> WorkerCalls:
        nodes: list[NodeInfo] = wait_ready(
            [actor.prepare.remote(()) for actor in actors], self.settings.timeout_s, "Starting the worker actors"
        )
        for node in nodes:
            problem = mismatch(running_versions(), node.versions, f"the worker on {node.node_ip} (pid {node.pid})")
            if problem:
                raise VersionMismatchError(problem)
        self._placements = assign_ranks(nodes)
        by_rank = [actors[placement.index] for placement in self._placements]
        calls = WorkerCalls(by_rank, self._placements, self.settings.timeout_s, on_broken=self.shutdown)
        envs = self.backend.worker_env(self._placements, calls, self.settings, self.run_id)
        setups = [
            actor.setup.remote(
                {**envs[rank], **extra_env_vars},
                self._context(self._placements[rank]),
                self._sink,
                executable_cls,
                executable_args,
                executable_kwargs,
            )
            for rank, actor in enumerate(by_rank)
        ]
        calls.gather(setups)
        return calls

    def _context(self, placement: WorkerPlacement) -> WorkerContext:
        slot = placement.slot
        return WorkerContext(
            rank=slot.rank,
            size=slot.size,
            local_rank=slot.local_rank,
            local_size=slot.local_size,
            cross_rank=slot.cross_rank,
            cross_size=slot.cross_size,
            node_rank=placement.node_rank,
            num_nodes=placement.num_nodes,
            node_id=placement.node.node_id,
            node_ip=placement.node.node_ip,
            hostname=placement.node.hostname,
            pid=placement.node.pid,
            gpu_ids=placement.node.gpu_ids,
            visible_gpu_ids=placement.visible_gpu_ids,
            backend=self.backend.name,
            run_id=self.run_id,
        )

    def shutdown(self) -> None:
        """Stop every worker and free the placement group. Safe to call at any time, any number of times."""
        elastic, self._elastic = self._elastic, None
        if elastic is not None:
            elastic.shutdown()
        calls, self._calls = self._calls, None
        sink, self._sink = self._sink, None
        group, self._placement_group = self._placement_group, None
        if calls is None and sink is None and group is None:
            return
        import ray

        for actor in calls.actors if calls is not None else []:
            ray.kill(actor, no_restart=True)
        if sink is not None:
            ray.kill(sink, no_restart=True)
        if group is not None and self._own_placement_group:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(group)
        self._placements = []
        self.backend.shutdown()

    def __enter__(self) -> RayExecutor:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.shutdown()

    # -- running ---------------------------------------------------------------------------------------------

    def run(
        self,
        fn: Callable[..., Any],
        args: Sequence[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        callbacks: Sequence[Callback] | None = None,
    ) -> list[Any]:
        """Run ``fn(*args, **kwargs)`` on every worker; return the results ordered by rank.

        ``callbacks`` receive, on a driver thread and while the job runs, every dict a worker passes to
        :func:`elastrain.executor.send`. A worker that raises or dies fails the call with
        :class:`~elastrain.executor.WorkerError` or :class:`~elastrain.executor.WorkerDiedError`.
        """
        if self._elastic is not None:
            checked = _check_callbacks(callbacks)
            # Horovod's own elastic loop runs untracked: no id that the dashboard would never know.
            self._last_run_id = None if self.backend.name == "horovod" else uuid.uuid4().hex
            return self._elastic.run(fn, args or (), kwargs or {}, checked, self._last_run_id)
        calls = self._require_started()
        payload = _put((fn, tuple(args or ()), dict(kwargs or {})))
        return self._call_all(
            calls, lambda actor, call_id, sink: actor.run.remote(payload, call_id, sink), callbacks, run_name(fn)
        )

    def execute(self, fn: Callable[[Any], Any], callbacks: Sequence[Callback] | None = None) -> list[Any]:
        """Run ``fn(executable)`` on every worker, with the instance built from ``executable_cls``."""
        self._not_in_elastic_mode("execute")
        calls = self._require_started()
        payload = _put(fn)
        return self._call_all(
            calls, lambda actor, call_id, sink: actor.execute.remote(payload, call_id, sink), callbacks, run_name(fn)
        )

    def execute_single(self, fn: Callable[[Any], Any]) -> Any:
        """Run ``fn(executable)`` on the rank 0 worker only and return its result."""
        self._not_in_elastic_mode("execute_single")
        calls = self._require_started()
        return calls.gather([calls.actors[0].execute.remote(fn, 0)])[0]

    def run_remote(
        self, fn: Callable[..., Any], args: Sequence[Any] | None = None, kwargs: Mapping[str, Any] | None = None
    ) -> list[Any]:
        """Start ``fn(*args, **kwargs)`` on every worker and return their ``ObjectRef``s, ordered by rank."""
        self._not_in_elastic_mode("run_remote")
        calls = self._require_started()
        payload = _put((fn, tuple(args or ()), dict(kwargs or {})))
        return [actor.run.remote(payload, 0) for actor in calls.actors]

    def _call_all(
        self,
        calls: WorkerCalls,
        submit: Callable[[Any, int, Any], Any],
        callbacks: Sequence[Callback] | None,
        name: str,
    ) -> list[Any]:
        checked = _check_callbacks(callbacks)
        placements = list(self._placements)  # a failed call shuts the executor down, which clears them
        self._last_run_id = uuid.uuid4().hex
        watch = RunWatch.start(lambda: self._run_record(calls, name), self._last_run_id)
        listeners = watch.listeners(checked)  # callbacks, and run observers that take metrics, want messages
        call_id = 0
        sink = None  # the workers get the message actor with every call whose messages someone wants
        if listeners:
            self._calls_with_callbacks += 1
            call_id = self._calls_with_callbacks
            sink = self._message_sink()
        try:
            with delivering(self._sink, listeners, call_id, _CALLBACK_DRAIN_S, tick=watch.tick):
                results = calls.gather([submit(actor, call_id, sink) for actor in calls.actors])
        except BaseException as error:
            crashed = _crashed_rank(error)
            if crashed is not None and watch.observed and 0 <= crashed[0] < len(placements):
                watch.worker_exited(_worker_records(calls, placements)[crashed[0]], "CRASHED", crashed[1])
            watch.failed(str(error))
            raise
        watch.finished()
        return results

    def _run_record(self, calls: WorkerCalls, name: str) -> dict[str, Any]:
        """What run observers learn of a call: its workers by rank, and where they run."""
        workers = _worker_records(calls, self._placements)
        return run_record(name, self._message_sink(), workers, len(workers))

    def _message_sink(self) -> Any:
        """The message actor. ``start()`` asks for it once the workers are up, so its process never competes
        with theirs (on a small machine that made start-up ~0.3 s slower) and nobody waits for it; the workers
        get it with each call whose callbacks want messages. Run observers take it as the executor's lifetime."""
        if self._sink is None:
            import ray

            self._sink = ray.remote(MessageSink).options(**control_actor_options()).remote()
        return self._sink

    def _not_in_elastic_mode(self, method: str) -> None:
        if self.options.elastic:
            raise NotImplementedError(
                f"{method}() is not available for elastic jobs, whose workers come and go; use run(), which "
                "returns the results of the workers that finished."
            )

    def _require_started(self) -> WorkerCalls:
        if self._calls is None:
            raise ExecutorNotStartedError(
                "This executor has no workers: call start() first (after a failed call or shutdown(), start() again)."
            )
        return self._calls


# Calls whose pickled function and arguments are larger than this go through the object store once, instead
# of being copied into every worker's task.
_INLINE_PAYLOAD_BYTES = 256 * 1024


def _put(value: Any) -> Any:
    """Pickle a call's function and arguments once for all workers."""
    import ray
    from ray import cloudpickle

    data = cloudpickle.dumps(value)
    return ray.put(data) if len(data) > _INLINE_PAYLOAD_BYTES else data


def _worker_records(calls: WorkerCalls, placements: list[WorkerPlacement]) -> list[dict[str, Any]]:
    return [
        worker_record(actor, p.slot.rank, p.slot.local_rank, p.node_rank, p.node)
        for actor, p in zip(calls.actors, placements, strict=True)
    ]


def _crashed_rank(error: BaseException) -> tuple[int, str] | None:
    """The rank of the worker that raised or died, and why in a line, when that is what failed the call."""
    if isinstance(error, WorkerError):
        return error.rank, exception_line(error.remote_traceback)
    if isinstance(error, WorkerDiedError):
        return error.rank, error.reason.strip().splitlines()[0] if error.reason.strip() else "its actor died"
    return None


def _check_callbacks(callbacks: Sequence[Callback] | None) -> list[Callback]:
    if callbacks is None:
        return []
    if callable(callbacks) or not all(callable(callback) for callback in callbacks):
        raise TypeError("callbacks must be a list of functions that each take one dict, e.g. [print].")
    return list(callbacks)


def _check_env_vars(extra_env_vars: Mapping[str, str] | None) -> dict[str, str]:
    env = dict(extra_env_vars or {})
    bad = {k: v for k, v in env.items() if not isinstance(k, str) or not isinstance(v, str)}
    if bad:
        raise ValueError(f"extra_env_vars must map strings to strings; convert these values: {bad!r}.")
    return env
