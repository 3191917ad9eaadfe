"""What an elastic executor holds between ``start()`` and ``shutdown()``: discovery, rendezvous, messages."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from elastrain.discovery import HostDiscovery, HostManager, RayHostDiscovery
from elastrain.executor._private.elastic.coordinator import Coordinator
from elastrain.executor._private.elastic.driver import ElasticDriver, ElasticStats
from elastrain.executor._private.elastic.group import ElasticOptions
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


class ElasticSession:
    def __init__(
        self, options: ExecutorOptions, settings: ExecutorSettings, env_vars: dict[str, str] | None = None
    ) -> None:
        import ray

        self.options = options
        self.settings = settings
        self.manager = HostManager(
            discovery_for(options, settings),
            poll_interval_s=settings.discovery_interval_s,
            cooldown_range=options.cooldown_range,
        ).start()
        self.coordinator: Any = ray.remote(Coordinator).options(**control_actor_options()).remote()
        self.sink: Any = ray.remote(MessageSink).options(**control_actor_options()).remote()
        # start(extra_env_vars=...) reaches every worker, replacements and spares included, as class defaults.
        self.worker_class: Any = (
            ray.remote(runtime_env={"env_vars": env_vars})(Worker) if env_vars else ray.remote(Worker)
        )
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
            ),
            startup_grace_s=self.settings.timeout_s,
            spare_worker=self.settings.spare_worker and self.options.override_discovery,
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
                    self.coordinator = ray.remote(Coordinator).options(**control_actor_options()).remote()

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
