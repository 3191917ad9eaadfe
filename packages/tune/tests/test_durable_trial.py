"""Durable trials: a function trainable and a Trainable class keep their checkpoints in a CheckpointStore on a
real S3 server, save in the background, keep exactly num_to_keep, and resume after Tune restarts them."""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from elastrain.durable import CheckpointStore
from elastrain.tune import DurableTrainable, trial_store
from elastrain_testutils.ray_testing import local_ray
from elastrain_testutils.storage_servers import ACCESS_KEY, SECRET_KEY, SeaweedS3

STEPS = 8
KEEP = 2


@pytest.fixture(scope="module", autouse=True)
def ray_instance() -> Iterator[None]:
    with local_ray(num_cpus=2):
        yield


@pytest.fixture
def bucket(seaweed: SeaweedS3) -> str:
    name = f"tune-{uuid.uuid4().hex[:8]}"
    seaweed.create_bucket(name)
    return name


def objective(config: dict[str, Any]) -> None:
    """Counts to STEPS, saving each step; fails once at step 5 when asked to."""
    import tempfile

    from ray import tune

    if config.get("arrow"):  # pyarrow's S3 client, for the store and the trial's markers alike
        import pyarrow.fs

        from elastrain.durable import ArrowSyncClient

        client = ArrowSyncClient(pyarrow.fs.S3FileSystem(**config["arrow"]))
        store = trial_store(config["storage"], num_to_keep=KEEP, sync_client=client)
    else:
        store = trial_store(config["storage"], num_to_keep=KEEP, storage_options=config["options"])
    step, resumed_from = 0, -1
    latest = store.latest()
    if latest is not None:
        with tempfile.TemporaryDirectory() as scratch:
            store.restore_async(latest, local_dir=scratch + "/state").result()
            step = resumed_from = int(Path(scratch, "state", "step").read_text())
    while step < STEPS:
        step += 1
        with tempfile.TemporaryDirectory() as scratch:
            Path(scratch, "step").write_text(str(step))
            store.save_async(scratch, step=step, staging="copy")
        if step == 5 and os.path.exists(config["crash_file"]):
            os.remove(config["crash_file"])
            store.wait()  # what was handed over is committed before this trial "crashes"
            raise RuntimeError("planned failure")
        watching = any(thread.name == "elastrain-raylet-watch" for thread in threading.enumerate())
        tune.report({"step": step, "resumed_from": resumed_from, "watching": watching})
    store.close()


def _run(trainable: Any, tmp_path: Path, param_space: dict[str, Any], **run: Any) -> Any:
    from ray import tune

    return tune.Tuner(
        trainable,
        param_space=param_space,
        run_config=tune.RunConfig(
            storage_path=str(tmp_path / "tune"),
            name="exp",
            failure_config=tune.FailureConfig(max_failures=1),
            verbose=0,
            **run,
        ),
    ).fit()[0]


@pytest.mark.parametrize("client", ["fsspec", "arrow"])
def test_a_function_trial_saves_in_the_background_and_resumes_from_its_store(
    seaweed: SeaweedS3, bucket: str, tmp_path: Path, client: str
) -> None:
    crash_file = tmp_path / "crash"
    crash_file.touch()
    base = f"s3://{bucket}/tune"
    config: dict[str, Any] = {"storage": base, "options": seaweed.storage_options(), "crash_file": str(crash_file)}
    if client == "arrow":
        config["arrow"] = {
            "access_key": ACCESS_KEY,
            "secret_key": SECRET_KEY,
            "endpoint_override": seaweed.endpoint_url,
            "scheme": "http",
            "region": "us-east-1",
        }
    result = _run(objective, tmp_path, config)
    assert result.error is None, result.error
    assert not crash_file.exists()
    assert result.metrics["step"] == STEPS
    assert result.metrics["resumed_from"] == 5
    assert result.metrics["watching"], "the trial's process does not watch its raylet"
    store = CheckpointStore(f"{base}/exp/{result.metrics['trial_id']}", storage_options=seaweed.storage_options())
    assert [c.step for c in store.list()] == [STEPS - 1, STEPS]  # exactly num_to_keep, on the server
    store.close()


class Counter(DurableTrainable):
    num_to_keep = KEEP

    def setup(self, config: dict[str, Any]) -> None:
        self.count = 0
        self.loaded: list[int] = []
        self.crash_file = config["crash_file"]

    def step(self) -> dict[str, Any]:
        self.count += 1
        if self.count == 5 and os.path.exists(self.crash_file):
            os.remove(self.crash_file)
            raise RuntimeError("planned failure")
        return {"count": self.count, "loaded": self.loaded[-1] if self.loaded else -1, "done": self.count >= STEPS}

    def save_state(self, directory: str) -> None:
        Path(directory, "count").write_text(str(self.count))

    def load_state(self, directory: str) -> None:
        self.count = int(Path(directory, "count").read_text())
        self.loaded.append(self.count)


def test_a_trainable_class_restores_the_checkpoint_tune_names(seaweed: SeaweedS3, bucket: str, tmp_path: Path) -> None:
    from ray import tune

    crash_file = tmp_path / "crash"
    crash_file.touch()
    options = seaweed.storage_options()
    trainable = type("Counting", (Counter,), {"storage": f"s3://{bucket}/tune", "storage_options": options})
    result = _run(
        trainable,
        tmp_path,
        {"crash_file": str(crash_file)},
        checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=2),
    )
    assert result.error is None, result.error
    assert result.metrics["count"] == STEPS
    assert result.metrics["loaded"] == 4
    store = CheckpointStore(f"s3://{bucket}/tune/exp/{result.metrics['trial_id']}", storage_options=options)
    assert len(store.list()) == KEEP
    store.close()


def test_trial_store_outside_a_trial_says_where_it_belongs() -> None:
    with pytest.raises(RuntimeError, match="runs inside a Tune trial"):
        trial_store("/tmp/nowhere")


class Climber(DurableTrainable):
    """Climbs by its config's rate; its state remembers which trial it started in, so a PBT exploit shows."""

    num_to_keep = KEEP

    def setup(self, config: dict[str, Any]) -> None:
        self.height = 0.0
        self.origin = self.trial_id

    def step(self) -> dict[str, Any]:
        self.height += self.config["rate"]
        return {"height": self.height, "origin": self.origin}

    def reset_config(self, new_config: dict[str, Any]) -> bool:
        self.config = new_config
        return True

    def save_state(self, directory: str) -> None:
        Path(directory, "state").write_text(f"{self.height} {self.origin}")

    def load_state(self, directory: str) -> None:
        height, self.origin = Path(directory, "state").read_text().split()
        self.height = float(height)


def test_pbt_exploit_loads_another_trials_checkpoint_from_its_store(
    seaweed: SeaweedS3, bucket: str, tmp_path: Path
) -> None:
    from ray import tune

    options = seaweed.storage_options()
    trainable = type("Climbing", (Climber,), {"storage": f"s3://{bucket}/tune", "storage_options": options})
    # Synchronous PBT: each perturbation waits for both trials, so the slow one exploits the fast one however far
    # apart Ray runs them. The asynchronous kind needed both to report close together, and once on a loaded
    # machine the slow trial never exploited.
    pbt = tune.schedulers.PopulationBasedTraining(
        time_attr="training_iteration", perturbation_interval=2, quantile_fraction=0.5, resample_probability=0,
        hyperparam_mutations={"rate": [1.0, 10.0]}, synch=True,
    )  # fmt: skip
    grid = tune.Tuner(
        trainable,
        param_space={"rate": tune.grid_search([1.0, 10.0])},
        tune_config=tune.TuneConfig(metric="height", mode="max", scheduler=pbt, reuse_actors=True),
        run_config=tune.RunConfig(
            storage_path=str(tmp_path / "tune"), name="pbt", stop={"training_iteration": 8}, verbose=0,
            checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=1),
        ),
    ).fit()  # fmt: skip
    assert all(result.error is None for result in grid)
    origins = {result.metrics["trial_id"]: result.metrics["origin"] for result in grid}
    slow, fast = sorted(origins)  # grid_search order: the first trial climbs at 1.0, the second at 10.0
    assert origins[fast] == fast
    assert origins[slow] == fast, "the slow trial did not take the fast one's state"
