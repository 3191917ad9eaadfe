"""Everything at once, on a 3-node ``ray.cluster_utils.Cluster``: one elastic job with one worker per node
persists its state to a real S3 server (SeaweedFS) and is tracked by the state actor and the dashboard while
a node is removed and added back, a worker is killed 10 times at random steps, the storage server is restarted
in the middle of an upload, and the state actor is killed. The job must finish with exactly the weights of a
run that never failed, every persisted state must still be there (or have been deleted by GC rules only) and
verify, and the dashboard must show the truth.

``ELASTRAIN_FAULTS_SEED`` replays a run's random choices (the seed is printed when the test fails).
"""

from __future__ import annotations

import os
import pickle
import random
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from kit.observing import RunView, Truth, dashboard
from kit.training import reference, train

from elastrain.durable import CheckpointStore, StatePersistence
from elastrain.executor import RayExecutor
from elastrain.state import get_or_create_state_actor, get_state_actor
from elastrain_testutils.ray_testing import NODE_DEFAULTS, local_cluster
from elastrain_testutils.storage_servers import SeaweedS3
from elastrain_testutils.waiting import wait_until

WORKER_KILLS = 10
PERSIST_EVERY = 10
KEEP = 4
BUCKET = "elastrain-faults"
FULL = 3  # one worker per node


@pytest.fixture(scope="module")
def seaweed() -> Iterator[SeaweedS3]:
    with SeaweedS3() as server:
        server.create_bucket(BUCKET)
        yield server


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    with local_cluster({"num_cpus": 2}, {"num_cpus": 2}, {"num_cpus": 2}) as cluster:
        yield cluster


def test_everything_fails_and_nothing_committed_is_lost(cluster: Any, seaweed: SeaweedS3, tmp_path: Path) -> None:
    import ray
    import s3fs

    seed = int(os.environ.get("ELASTRAIN_FAULTS_SEED") or random.SystemRandom().randrange(2**31))
    print(f"ELASTRAIN_FAULTS_SEED={seed}")  # shown with the output of a failed test
    rng = random.Random(seed)  # noqa: S311 - chaos, not secrets
    uri = f"s3://{BUCKET}/job"
    options = seaweed.storage_options()
    store = CheckpointStore(uri, storage_options=options)
    fs = s3fs.S3FileSystem(**options, skip_instance_cache=True)
    get_or_create_state_actor(snapshot_uri=str(tmp_path / "state"), snapshot_interval_s=0.5)

    truth = Truth()
    stop_file = tmp_path / "stop"
    persistence = StatePersistence(uri, every=PERSIST_EVERY, num_to_keep=KEEP, storage_options=options, timeout_s=120)
    settings = RayExecutor.create_settings(timeout_s=60, discovery_interval_s=0.2)
    executor = RayExecutor(settings, min_workers=1, max_workers=FULL, cpus_per_worker=2, elastic_timeout=180)
    seen_committed: dict[str, tuple[int, int]] = {}  # every persisted state ever listed: name -> (step, sequence)
    log: list[str] = []

    def note(event: str) -> None:
        log.append(f"step {truth.step} size {truth.size}: {event}")

    def remember_committed() -> None:
        seen_committed.update({c.name: (c.step or 0, c.sequence) for c in store.list()})

    def back_to_full_size(after: str, resets_above: int = -1) -> None:
        wait_until(
            lambda: truth.settled(FULL, resets_above),
            timeout_s=120,
            what=f"the job to be back at {FULL} workers after {after}; events so far: {log}",
            interval_s=0.1,
        )
        remember_committed()

    def pending_markers() -> set[str]:
        """Upload markers: written before a state's files, removed once it is committed (or collected later,
        when its writer died)."""
        try:
            return set(fs.ls(f"{BUCKET}/job/_pending", refresh=True))
        except FileNotFoundError:
            return set()

    # On a failure the executor shuts down first, which ends the job the pool waits for.
    with ThreadPoolExecutor(1) as pool, dashboard(cluster.address, tmp_path / "dashboard.log") as api, executor:
        view = RunView(api, lambda: executor.last_run_id)
        executor.start()
        kwargs = {"persistence": persistence, "ballast_bytes": 4 << 20, "stop_file": str(stop_file)}
        job = pool.submit(executor.run, train, [100_000], kwargs, [truth])
        back_to_full_size("the start")
        started = view.wait(lambda run: run["run_status"] == "RUNNING", timeout_s=60, what="the run RUNNING")

        # A node goes away and comes back (Ray's Cluster is changed from this thread, never the head node).
        resets = truth.resets()
        cluster.remove_node(cluster.list_all_nodes()[-1])
        note("node removed")
        wait_until(lambda: truth.size < FULL, timeout_s=60, what="the job to shrink after a node was removed")
        cluster.add_node(num_cpus=2, **NODE_DEFAULTS)
        note("node added")
        back_to_full_size("a node came back", resets)

        kills = 0
        for event in ["kill"] * 4 + ["storage"] + ["kill"] * 3 + ["state actor"] + ["kill"] * (WORKER_KILLS - 7):
            resets = truth.resets() if event == "kill" else -1
            if event == "kill":
                target = truth.step + rng.randint(3, 40)
                wait_until(lambda: truth.step >= target, timeout_s=60, what=f"step {target}")  # noqa: B023
                rank = rng.randrange(FULL)
                os.kill(truth.pid_of(rank), signal.SIGKILL)
                kills += 1
                note(f"killed rank {rank}")
            elif event == "storage":
                # A marker that appears now is an upload running now (old ones may be left by killed workers).
                before = pending_markers()
                wait_until(
                    lambda: pending_markers() - before,  # noqa: B023
                    timeout_s=60,
                    what="an upload to start",
                    interval_s=0.005,
                )
                seaweed.kill()
                note("storage server killed mid-upload")
                time.sleep(3)  # training goes on meanwhile; uploads fail and retry
                seaweed.start()
                note("storage server back")
            else:
                actor = get_state_actor()
                assert actor is not None
                ray.kill(actor, no_restart=False)
                note("state actor killed")
                view.wait(
                    lambda run: run["start_time_ms"] == started["start_time_ms"],
                    timeout_s=60,
                    what="the restarted state actor to show the run again",
                )
            back_to_full_size(event, resets)

        # Enough chaos: end the job a little ahead of every rank.
        last_step = truth.step + 100
        (tmp_path / "stop.tmp").write_text(str(last_step))
        os.replace(tmp_path / "stop.tmp", stop_file)
        note(f"stop at {last_step}")
        results = job.result(timeout=300)
        final = view.wait(lambda run: run["run_status"] == "FINISHED", timeout_s=30, what="the run FINISHED")

    assert kills == WORKER_KILLS
    assert FULL - 1 in truth.sizes, f"the job never shrank: {truth.sizes}"

    # The job finished with exactly the weights of a run that never failed.
    expected = reference(last_step)
    assert len(results) == FULL
    for result in results:
        assert result["weights"] == pytest.approx(expected, rel=1e-9, abs=1e-12), log

    # Every persisted state is still there, or was deleted only by GC (num_to_keep): nothing committed was
    # lost, and every kept one verifies and holds exactly the reference weights of its step.
    remember_committed()
    kept = store.list()
    assert len(kept) == KEEP
    # The committed order is the order of commit counts (a former rank 0's late copy never became latest), and
    # the latest is the most advanced state ever committed.
    commit_counts = [c.metrics["commits"] for c in kept]
    assert commit_counts == sorted(set(commit_counts)), commit_counts
    assert [c.step for c in kept] == commit_counts
    assert kept[-1].step == max(step for step, _ in seen_committed.values())
    oldest_kept = min((c.step or 0, c.sequence) for c in kept)
    for name, order in seen_committed.items():
        assert name in {c.name for c in kept} or order < oldest_kept, f"{name} was lost; {log}"
    persisted_steps = []
    for checkpoint in kept:
        target = tmp_path / "restored" / checkpoint.name
        store.restore(checkpoint, local_dir=target)
        snapshot = pickle.loads((target / "state.pkl").read_bytes())  # noqa: S301 - our own
        model_state, values = snapshot["handlers"]["model"], snapshot["values"]
        assert [float(v) for v in model_state["weight"].flatten()] == pytest.approx(
            reference(values["step"]), rel=1e-9, abs=1e-12
        )
        persisted_steps.append(values["step"])
    assert max(persisted_steps) > last_step - PERSIST_EVERY  # the job's last state was persisted too
    store.close()

    # The dashboard shows the truth: finished, the workers that finished, every reset, the original start time.
    assert final["start_time_ms"] == started["start_time_ms"]
    assert final["world_size"] == FULL
    finished_workers = {(w["world_rank"], w["pid"], w["node_id"]) for w in final["workers"]}
    assert finished_workers == truth.workers(FULL)
    assert {pid for _, pid, _ in finished_workers} == {r["pid"] for r in results}
    assert final["resets"] >= WORKER_KILLS + 2, log
