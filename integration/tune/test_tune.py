"""Ray Tune on elastrain, on a 3-node ``ray.cluster_utils.Cluster`` with a real S3 server (SeaweedFS).

Three trials run at once: two elastic 2-worker executor jobs (the deterministic kit job, persisting to their own
stores) and one durable function trial. The trials' own processes live on the head node; their workers on the
two worker nodes, one worker of each elastic trial per node. Then:

1. a worker node is lost (hard): both elastic trials go on with one worker each, and Tune never restarts them
   (their trial process keeps its pid); the durable trial keeps reporting; the longest gaps are printed;
2. a node joins: Ray places the lost bundles on it and both elastic trials grow back to 2 workers;
3. one elastic trial's own process is killed outright: Tune restarts it, and it resumes from its latest commit.

At the end every trial keeps exactly ``num_to_keep`` checkpoints and the elastic trials' weights equal those of a
run that never failed.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kit.training import reference, train
from ray import tune

from elastrain.durable import CheckpointStore
from elastrain.tune import executor_trainable, trial_persistence
from elastrain_testutils.ray_testing import NODE_DEFAULTS, local_cluster
from elastrain_testutils.storage_servers import SeaweedS3
from elastrain_testutils.waiting import wait_until

BUCKET = "elastrain-tune"
KEEP = 2
PERSIST_EVERY = 10
DRIVER = {"trial_driver": 1}  # trial processes go to the head node, the only one with this resource


@pytest.fixture(scope="module")
def seaweed() -> Iterator[SeaweedS3]:
    with SeaweedS3() as server:
        server.create_bucket(BUCKET)
        yield server


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    head = {"num_cpus": 0, "resources": {"trial_driver": 3}}
    with local_cluster(head, {"num_cpus": 2}, {"num_cpus": 2}) as cluster:
        yield cluster


def elastic_job(config: dict[str, Any]) -> dict[str, Any]:
    """Runs on every worker of an elastic trial: the kit's job, persisting to the trial's store."""
    return train(10**9, step_sleep_s=0.05, persistence=trial_persistence(), stop_file=config["stop_file"])


# Every result of every trial as the Tune driver gets it (appends are atomic; Tune may pickle its callbacks, so
# they hold no lock).
RESULTS: dict[str, list[dict[str, Any]]] = defaultdict(list)


class OnResult(tune.Callback):
    def on_trial_result(
        self, iteration: int, trials: list[Any], trial: Any, result: dict[str, Any], **info: Any
    ) -> None:
        RESULTS[trial.trial_id].append({**result, "seen": time.time()})


class Recorder:
    """Reads what :class:`OnResult` recorded."""

    results = RESULTS

    def callback(self) -> OnResult:
        return OnResult()

    def latest(self, trial_id: str) -> dict[str, Any]:
        found = RESULTS.get(trial_id)
        return dict(found[-1]) if found else {}

    def of(self, trial_id: str) -> list[dict[str, Any]]:
        return list(RESULTS.get(trial_id, []))


def _longest_gap(results: list[dict[str, Any]], start: float, end: float) -> float:
    times = [r["seen"] for r in results if start - 5 <= r["seen"] <= end]
    return max((b - a for a, b in itertools.pairwise(times)), default=float("inf"))


def test_elastic_trials_survive_a_lost_node_and_a_restarted_trial_resumes(
    cluster: Any, seaweed: SeaweedS3, tmp_path: Path
) -> None:
    options = seaweed.storage_options()
    base = f"s3://{BUCKET}/tune"
    elastic = executor_trainable(
        elastic_job,
        storage=base,
        storage_options=options,
        min_workers=1,
        max_workers=2,
        cpus_per_worker=1,
        driver=DRIVER,
        strategy="SPREAD",
        persist_every=PERSIST_EVERY,
        num_to_keep=KEEP,
    )
    stop = {name: str(tmp_path / f"stop-{name}") for name in ("a", "b", "d")}
    recorder = Recorder()
    tuner = tune.Tuner(
        elastic,
        param_space={"stop_file": tune.grid_search([stop["a"], stop["b"]])},
        run_config=tune.RunConfig(
            storage_path=str(tmp_path / "tune"),
            name="elastic",
            callbacks=[recorder.callback()],
            failure_config=tune.FailureConfig(max_failures=1),
            verbose=0,
        ),
    )
    # Tune keeps state per process: the durable trial runs in a Tuner of its own, in another process.
    durable_results = tmp_path / "durable.jsonl"
    durable = subprocess.Popen(
        [
            sys.executable, str(Path(__file__).with_name("durable_tuner.py")), "--address", cluster.address,
            "--storage", base, "--options", json.dumps(options), "--stop-file", stop["d"],
            "--results", str(durable_results), "--tune-dir", str(tmp_path / "tune"),
        ]
    )  # fmt: skip
    grids: dict[str, Any] = {}
    errors: list[BaseException] = []

    def fit() -> None:
        try:
            grids["elastic"] = tuner.fit()
        except BaseException as error:  # reported by the test thread, with where it came from
            errors.append(RuntimeError("".join(traceback.format_exception(error))))

    thread = threading.Thread(target=fit, daemon=True)
    thread.start()
    try:
        _scenario(cluster, recorder, stop, errors, durable_results)
    finally:
        for path in stop.values():  # whatever happened, let every trial end
            if not os.path.exists(path):
                Path(path).write_text("0")
        thread.join(timeout=240)
        try:
            durable.wait(timeout=120)
        finally:
            durable.kill()
    assert not errors, errors
    final = _durable_lines(durable_results)[-1]
    assert final.get("final"), final
    assert not final["error"], final
    grids["durable"] = final
    _check_outcome(grids, recorder, base, options)


def _durable_lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _scenario(
    cluster: Any, recorder: Recorder, stop: dict[str, str], errors: list[BaseException], durable_results: Path
) -> None:
    def trials_at(size: int) -> list[str]:
        ids = [t for t, rs in list(recorder.results.items()) if rs]
        return ids if len(ids) == 2 and all(recorder.latest(t).get("size") == size for t in ids) else []

    elastic_ids = wait_until(lambda: errors or trials_at(2), timeout_s=180, what="both elastic trials at 2 workers")
    assert not errors, errors
    wait_until(lambda: _durable_lines(durable_results), timeout_s=60, what="the durable trial's first result")
    pids = {t: recorder.latest(t)["pid"] for t in elastic_ids}
    wait_until(
        lambda: all(recorder.latest(t)["step"] > PERSIST_EVERY for t in elastic_ids),
        timeout_s=60,
        what="a first persisted commit",
    )

    # 1. A worker node is lost: each elastic trial goes on with its survivor.
    lost_at = time.time()
    cluster.remove_node(next(iter(cluster.worker_nodes)), allow_graceful=False)
    wait_until(lambda: trials_at(1), timeout_s=60, what="both elastic trials going on with 1 worker")
    shrunk_at = time.time()
    # 2. A node joins: the lost bundles are placed on it and both trials grow back.
    cluster.add_node(num_cpus=2, **NODE_DEFAULTS)
    wait_until(lambda: trials_at(2), timeout_s=120, what="both elastic trials back at 2 workers")
    grown_at = time.time()
    assert {t: recorder.latest(t)["pid"] for t in elastic_ids} == pids, "Tune restarted an elastic trial"
    gaps = {t: _longest_gap(recorder.of(t), lost_at, grown_at) for t in elastic_ids}
    gaps["durable"] = _longest_gap(_durable_lines(durable_results), lost_at, grown_at)
    print(
        f"\nnode lost → both elastic trials at 1 worker: {shrunk_at - lost_at:.1f} s; "
        f"node added → back at 2: {grown_at - shrunk_at:.1f} s"
    )
    print(
        "longest gap between results, node lost → grown back: " + ", ".join(f"{t}: {g:.2f} s" for t, g in gaps.items())
    )
    assert gaps["durable"] < 10, "the durable trial stopped reporting while a node of other trials was lost"

    # 3. One elastic trial's own process is killed: Tune restarts it, and it resumes from its latest commit.
    victim = elastic_ids[0]
    killed_at = time.time()
    os.kill(int(pids[victim]), signal.SIGKILL)
    wait_until(
        lambda: recorder.latest(victim).get("pid") not in (None, pids[victim]),
        timeout_s=120,
        what="the trial restarted by Tune",
    )
    print(f"trial process killed → first result of the restarted trial: {time.time() - killed_at:.1f} s")
    for trial_id in elastic_ids:  # end both a little after where they are now
        Path(stop[_stop_key(trial_id, recorder)]).write_text(str(int(recorder.latest(trial_id)["step"]) + 20))
    Path(stop["d"]).write_text("0")


def _stop_key(trial_id: str, recorder: Recorder) -> str:
    return "a" if recorder.latest(trial_id)["config"]["stop_file"].endswith("stop-a") else "b"


def _check_outcome(grids: dict[str, Any], recorder: Recorder, base: str, options: dict[str, Any]) -> None:
    def kept(experiment: str, trial_id: str) -> list[int | None]:
        store = CheckpointStore(f"{base}/{experiment}/{trial_id}", storage_options=options)
        steps = [c.step for c in store.list()]
        store.close()
        return steps

    for result in grids["elastic"]:
        assert result.error is None, result.error
        assert len(kept("elastic", result.metrics["trial_id"])) == KEEP
        last = int(Path(result.config["stop_file"]).read_text())
        assert result.metrics["step"] == last
        # Equal up to float64 rounding: a world of 1 sums a step's gradient in another order than a world of 2.
        assert result.metrics["weights"] == pytest.approx(reference(last), rel=1e-9, abs=1e-12)
    assert len(kept("durable", grids["durable"]["trial_id"])) == KEEP
    restarted = [r for r in grids["elastic"] if r.metrics["first_step"] > 0]
    assert len(restarted) == 1, "exactly the trial whose process was killed resumed from a commit"
    assert restarted[0].metrics["first_step"] % PERSIST_EVERY == 0
