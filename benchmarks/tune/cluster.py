"""What both cases share: the Cluster and SeaweedFS set-up, the Tune callback recording every result, and the
driver of one scenario (``node_loss``: run a trainable, lose a worker node, time the recovery).

``stop_step`` and ``log_event`` also run inside the trials: ``bench.py`` has Ray pickle this module by value.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

STEP_S = 0.05
KEEP = 2
BUCKET = "bench-tune"
HEAD = {"num_cpus": 0, "resources": {"trial_driver": 2}}
WORKER_NODE = {"num_cpus": 2}
# Bounds on every wait, so that a scenario that goes wrong ends (bench.py kills its process after CHILD_TIMEOUT_S).
READY_BOUND_S = 240.0
RECOVERY_BOUND_S = 150.0
WATCH_BOUND_S = 40.0  # how long after the loss to keep looking for the GCS to declare the node dead
FIT_JOIN_S = 120.0
START_TIMEOUT_S = 120.0  # a trial's start: the Tune trainable's actors joining a gloo group, a restore
S3_ENV = "ELASTRAIN_BENCH_TUNE_S3"  # the parent's SeaweedFS, handed to each scenario's process


# -- what runs in the trials ----------------------------------------------------------------------------------


def stop_step(path: str) -> int:
    """The step to stop at: the number in the stop file once the driver wrote it (with a margin), else never."""
    try:
        return int(Path(path).read_text())
    except (FileNotFoundError, ValueError):
        return 10**9


def log_event(config: dict[str, Any], name: str, **fields: Any) -> None:
    """One line in the scenario's event log (a local file every Cluster node shares): where a restart spends time."""
    with open(config["events"], "a") as out:
        out.write(json.dumps({"event": name, "t": time.time(), "pid": os.getpid(), **fields}) + "\n")


# -- the driver of one scenario -------------------------------------------------------------------------------

# Every result the driver receives. Tune may pickle its callbacks, so the callback keeps no state of its own
# (and no lock: list appends are atomic).
RESULTS: list[dict[str, Any]] = []
KEPT = ("step", "t", "size", "rank", "node", "node_rank1", "restored_step", "pid")


def _callback() -> Any:
    from ray import tune

    class RecordResults(tune.Callback):
        def on_trial_result(
            self, iteration: int, trials: list[Any], trial: Any, result: dict[str, Any], **info: Any
        ) -> None:
            RESULTS.append({**{key: result.get(key) for key in KEPT}, "trial_id": trial.trial_id})

    return RecordResults()


def _wait_for(check: Callable[[], Any], bound_s: float, what: str, fit: _Fit) -> Any:
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        if fit.error:
            raise RuntimeError(f"Tune failed while waiting for {what}:\n{fit.error}")
        found = check()
        if found:
            return found
        time.sleep(0.05)
    raise TimeoutError(f"no {what} within {bound_s:g} s")


class _Fit:
    """``tuner.fit()`` in a daemon thread, so the scenario can kill a node meanwhile and never hangs on it."""

    def __init__(self, tuner: Any) -> None:
        self.tuner = tuner
        self.grid: Any = None
        self.error = ""
        self.thread = threading.Thread(target=self._run, name="tune-fit", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.grid = self.tuner.fit()
        except BaseException as error:
            self.error = "".join(traceback.format_exception(error))[-3000:]

    def trial_error(self) -> str | None:
        if self.grid is None:
            return "fit did not finish" if not self.error else self.error
        errors = [str(result.error)[-500:] for result in self.grid if result.error is not None]
        return "\n".join(errors) or None


@contextlib.contextmanager
def _s3() -> Iterator[dict[str, Any]]:
    """The parent's SeaweedFS when there is one, else one of this process's own (a scenario run by hand)."""
    given = os.environ.get(S3_ENV)
    if given:
        yield json.loads(given)
        return
    from elastrain_testutils.storage_servers import SeaweedS3

    with SeaweedS3() as server:
        yield serve(server)


def serve(server: Any) -> dict[str, Any]:
    server.create_bucket(BUCKET)
    return {"endpoint": server.endpoint_url, "options": server.storage_options(read_timeout=60)}


def _arrow_fs(s3: dict[str, Any]) -> Any:
    import pyarrow.fs

    from elastrain_testutils.storage_servers import ACCESS_KEY, SECRET_KEY

    return pyarrow.fs.S3FileSystem(
        access_key=ACCESS_KEY,
        secret_key=SECRET_KEY,
        endpoint_override=s3["endpoint"].removeprefix("http://"),
        scheme="http",
    )


@contextlib.contextmanager
def _cluster() -> Iterator[Any]:
    import ray
    from ray.cluster_utils import Cluster

    from elastrain_testutils.ray_testing import NODE_DEFAULTS

    cluster = Cluster(initialize_head=True, head_node_args={**NODE_DEFAULTS, "include_dashboard": False, **HEAD})
    try:
        for _ in range(2):
            cluster.add_node(**NODE_DEFAULTS, **WORKER_NODE)
        ray.init(address=cluster.address, log_to_driver=False)
        cluster.wait_for_nodes(timeout=60)
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


def _write_stop(path: str, step: int) -> None:
    scratch = path + ".tmp"
    Path(scratch).write_text(str(step))
    os.replace(scratch, path)  # a trial never reads a half-written number


def node_loss(
    name: str,
    make_trainable: Callable[[dict[str, Any], dict[str, Any]], Any],
    *,
    ready: Callable[[list[dict[str, Any]]], bool],
    victim: Callable[[list[dict[str, Any]], Any], Any],
    recovered: Callable[[list[dict[str, Any]], float], dict[str, Any] | None],
    after: Callable[[Any, float], dict[str, Any]] | None = None,
    checkpoint_config: Any = None,
    finished: Callable[[dict[str, Any], str, str], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Run the trainable (``make_trainable(s3, config)``) in a Tuner on a fresh Cluster, lose a worker node once
    ``ready``, and time the recovery."""
    from ray import tune

    with _s3() as s3, _cluster() as cluster, tempfile.TemporaryDirectory(prefix="bench-tune-") as scratch:
        run = f"{name}-{uuid.uuid4().hex[:8]}"
        config = {
            "stop_file": os.path.join(scratch, "stop"),
            "events": os.path.join(scratch, "events.jsonl"),
            "storage": f"s3://{BUCKET}/{run}/elastrain",
            "options": s3["options"],
        }
        tuner = tune.Tuner(
            make_trainable(s3, config),
            param_space=config,
            run_config=tune.RunConfig(
                name=name,
                storage_path=f"{BUCKET}/{run}/tune",
                storage_filesystem=_arrow_fs(s3),
                callbacks=[_callback()],
                failure_config=tune.FailureConfig(max_failures=2),
                checkpoint_config=checkpoint_config,
                verbose=0,
            ),
        )
        fit = _Fit(tuner)
        outcome: dict[str, Any] = {}
        done = threading.Event()
        watcher: threading.Thread | None = None
        try:
            _wait_for(lambda: ready(list(RESULTS)), READY_BOUND_S, "trial ready for the node loss", fit)
            node = victim(list(RESULTS), cluster)
            killed_at = time.time()
            cluster.remove_node(node, allow_graceful=False)
            outcome["remove_node_s"] = time.time() - killed_at
            watcher = threading.Thread(target=_watch_node, args=(node.node_id, killed_at, outcome, done), daemon=True)
            watcher.start()
            outcome.update(
                _wait_for(lambda: recovered(list(RESULTS), killed_at), RECOVERY_BOUND_S, "step after the loss", fit)
            )
            if after is not None:
                outcome.update(after(cluster, killed_at))
            outcome.update(_events_after(config["events"], killed_at))
        finally:
            last = max((r["step"] for r in RESULTS if isinstance(r.get("step"), int)), default=0)
            _write_stop(config["stop_file"], last + 30)
            fit.thread.join(FIT_JOIN_S)
            if watcher is not None:  # bounded: the GCS normally declares the node dead within ~15 s
                watcher.join(max(0.0, killed_at + WATCH_BOUND_S - time.time()))
            done.set()
        outcome["trial_error"] = fit.trial_error()
        if finished is not None:
            outcome.update(finished(s3, run, name))
    return outcome


def _watch_node(node_id: str, killed_at: float, outcome: dict[str, Any], done: threading.Event) -> None:
    """When the GCS declares the lost node dead (it then places that node's placement-group bundles again)."""
    import ray

    while not done.wait(0.25):
        with contextlib.suppress(Exception):  # the scenario may be shutting Ray down
            if any(n["NodeID"] == node_id and not n["Alive"] for n in ray.nodes()):
                outcome["gcs_node_dead_s"] = time.time() - killed_at
                return


def _events_after(path: str, killed_at: float) -> dict[str, Any]:
    """When each event of the trials first happened after the node loss, in seconds after it (and the error that
    ended the Tune trainable's attempt)."""
    if not os.path.exists(path):
        return {}
    found: dict[str, Any] = {}
    for line in Path(path).read_text().splitlines():
        event = json.loads(line)
        key = f"event_{event['event'].replace(' ', '_')}_s"
        if event["t"] > killed_at and key not in found:
            found[key] = event["t"] - killed_at
            if "error" in event:
                found["failed_with"] = event["error"]
    return found


def pids_before(results: list[dict[str, Any]], killed_at: float) -> set[Any]:
    return {r["pid"] for r in results if r["t"] is not None and r["t"] <= killed_at}


def first_after(results: list[dict[str, Any]], killed_at: float, keep: Callable[[dict[str, Any]], bool]) -> Any:
    after = [r for r in results if r["t"] is not None and r["t"] > killed_at and keep(r)]
    return min(after, key=lambda r: r["t"]) if after else None


def first_of_restarted(results: list[dict[str, Any]], killed_at: float) -> Any:
    """The first result after the loss from a process that did not report before it (the restarted trial's)."""
    before = pids_before(results, killed_at)
    return first_after(results, killed_at, lambda r: r["pid"] not in before)


def worker_node(cluster: Any, node_id: str) -> Any:
    nodes = {node.node_id: node for node in cluster.worker_nodes}
    if node_id not in nodes:
        raise RuntimeError(f"the trial reported node {node_id}, which is no worker node of the Cluster")
    return nodes[node_id]
