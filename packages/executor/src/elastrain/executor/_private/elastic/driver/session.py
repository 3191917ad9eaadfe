"""What an elastic executor holds between ``start()`` and ``shutdown()``: discovery, rendezvous, messages."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from elastrain.discovery import HostDiscovery, HostManager, PlacementGroupHostDiscovery, RayHostDiscovery
from elastrain.executor._private.elastic.coordinator import rendezvous_actor
from elastrain.executor._private.elastic.driver.shell import CONTROL_GROUP, ElasticDriver, ElasticStats
from elastrain.executor._private.elastic.options import ElasticOptions
from elastrain.executor._private.errors import PlacementError
from elastrain.executor._private.messages import Callback, MessageSink, delivering
from elastrain.executor._private.observers import RunWatch, run_name, run_record
from elastrain.executor._private.options import ExecutorOptions
from elastrain.executor._private.placement import control_actor_options
from elastrain.executor._private.settings import ExecutorSettings
from elastrain.executor._private.worker import Worker

logger = logging.getLogger("elastrain.executor")
_CALLBACK_DRAIN_S = 10.0
# How long shutdown() lets a running call stop its workers before the rendezvous actors go.
_SHUTDOWN_WAIT_S = 10.0


def discovery_for(options: ExecutorOptions, settings: ExecutorSettings) -> HostDiscovery:
    if options.override_discovery:
        group = _current_placement_group(options)
        if group is not None:  # every bundle that holds a worker is the job's (pass a discovery to leave some out)
            discovery = PlacementGroupHostDiscovery(
                group,
                use_gpu=options.use_gpu,
                cpus_per_worker=options.cpus_per_worker,
                gpus_per_worker=options.gpus_per_worker or 1,
            )
            if not discovery.bundle_slots:
                gpus = f", {options.gpus_per_worker:g} GPU" if options.use_gpu else ""
                raise PlacementError(
                    f"This elastic job runs in a placement group whose bundles ({group.bundle_specs}) hold no worker "
                    f"of {options.cpus_per_worker:g} CPU{gpus}; give the group bundles the size of a worker "
                    "(elastrain.tune.trial_resources does), or pass use_current_placement_group=False to place the "
                    "workers outside it."
                )
            if discovery.total_slots < options.num_workers:
                raise PlacementError(
                    f"This elastic job runs in a placement group that holds {discovery.total_slots} workers, below "
                    f"min_workers={options.num_workers}; lower min_workers or give the group more worker bundles."
                )
            return discovery
        return RayHostDiscovery(
            use_gpu=options.use_gpu,
            cpus_per_worker=options.cpus_per_worker,
            gpus_per_worker=options.gpus_per_worker or 1,
        )
    if not isinstance(settings.discovery, HostDiscovery):
        raise ValueError(
            "override_discovery=False needs a discovery: set settings.discovery to an "
            "elastrain.discovery.HostDiscovery (e.g. StaticHostDiscovery or ScriptHostDiscovery)."
        )
    return settings.discovery


def _current_placement_group(options: ExecutorOptions) -> Any:
    """The placement group this process runs in, if the job should use it."""
    if not options.use_current_placement_group:
        return None
    from ray.util.placement_group import get_current_placement_group

    return get_current_placement_group()


class ElasticSession:
    def __init__(
        self, options: ExecutorOptions, settings: ExecutorSettings, env_vars: dict[str, str] | None = None
    ) -> None:
        import ray

        self.options = options
        self.settings = settings
        discovery = discovery_for(options, settings)
        # In a placement group, workers go into its bundles, and there is no spare: a lost bundle is placed again
        # by Ray, and the next poll sees it.
        self.bundles = discovery if isinstance(discovery, PlacementGroupHostDiscovery) else None
        self.manager = HostManager(
            discovery,
            poll_interval_s=settings.discovery_interval_s,
            cooldown_range=options.cooldown_range,
        ).start()
        self.coordinator: Any = rendezvous_actor(control_actor_options())
        self.sink: Any = ray.remote(MessageSink).options(**control_actor_options()).remote()
        # start(extra_env_vars=...) reaches every worker, replacements and spares included, as class defaults.
        # A "control" thread answers the driver's roll call while the job's function runs in the default one.
        decorate: Any = ray.remote
        actor_options: dict[str, Any] = {"concurrency_groups": {CONTROL_GROUP: 1}}
        if env_vars:
            actor_options["runtime_env"] = {"env_vars": env_vars}
        self.worker_class: Any = decorate(**actor_options)(Worker)
        self.calls = 0
        self.driver: ElasticDriver | None = None  # the running call's driver
        self.last_stats: ElasticStats | None = None
        self._shut_down = False

    def run(
        self,
        fn: Callable[..., Any],
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
        callbacks: list[Callback],
        run_id: str | None = None,
    ) -> list[Any]:
        import ray

        watch = RunWatch.start(
            lambda: run_record(run_name(fn), self.sink, [], 0, self.options.num_workers, self.options.max_workers),
            run_id,
        )
        listeners = watch.listeners(callbacks)  # callbacks, and run observers that take metrics, want messages
        self.calls += 1
        call_id = self.calls if listeners else 0
        driver = ElasticDriver(
            options=self.options,
            manager=self.manager,
            coordinator=self.coordinator,
            sink=self.sink,
            worker_class=self.worker_class,
            elastic_options=ElasticOptions(
                formation_timeout_s=self.settings.timeout_s,
                collective_timeout_s=self.settings.collective_timeout_s,
                backend=None,
                liveness_timeout_s=self.settings.liveness_timeout_s,
                nics=self.settings.nics,
                start_over_on_state_loss=self.settings.start_over_on_state_loss,
            ),
            startup_grace_s=self.settings.timeout_s,
            spare_worker=self.settings.spare_worker and self.options.override_discovery and self.bundles is None,
            bundles=self.bundles,
            watch=watch,
        )
        self.driver = driver
        from ray import cloudpickle

        payload = ray.put(cloudpickle.dumps((fn, tuple(args), dict(kwargs))))
        with delivering(self.sink, listeners, call_id, _CALLBACK_DRAIN_S, tick=watch.tick):
            try:
                results = driver.run(payload, call_id)
            except BaseException as error:
                watch.failed(str(error))
                raise
            else:
                watch.finished()
                return results
            finally:
                self.driver = None
                self.last_stats = driver.stats
                # A fresh rendezvous actor per call, whatever happens: worlds of one call never leak into the next.
                ray.kill(self.coordinator, no_restart=True)
                if not self._shut_down:
                    self.coordinator = rendezvous_actor(control_actor_options())

    def shutdown(self) -> None:
        import ray

        self._shut_down = True
        driver = self.driver
        if driver is not None:  # a call still running in another thread ends, and its workers with it
            driver.stop("the executor was shut down while it ran")
        self.manager.stop()  # ends a call still waiting for hosts
        if driver is not None and not driver.wait_ended(_SHUTDOWN_WAIT_S):
            logger.warning("The running elastic call did not stop within %s s; killing its actors.", _SHUTDOWN_WAIT_S)
            driver.pool.stop_all()
        ray.kill(self.coordinator, no_restart=True)
        ray.kill(self.sink, no_restart=True)
