"""A run with a crash and a replacement, as MLflow's own client reads it back from a local file store."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import play_a_run_with_a_crash, run_record

from elastrain.trackers import MLflowTracker, TrackersObserver, use


@pytest.fixture(autouse=True)
def file_store_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    # MLflow 3 keeps its file store only on request (it steers new users to a database): a user who logs to
    # ./mlruns sets this too.
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")


def test_the_run_its_losses_world_size_and_resets_are_in_mlflow(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    uri = (tmp_path / "mlruns").as_uri()
    use(MLflowTracker(tracking_uri=uri, experiment="elastic"))
    handle = TrackersObserver().start_run(run_record())
    assert handle is not None
    play_a_run_with_a_crash(handle)

    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("elastic")
    assert experiment is not None
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.status == "FINISHED"
    assert run.info.run_name == "train"
    assert run.data.tags["elastrain.run_id"] == "0123456789abcdef"
    assert run.data.params == {"world_size": "2", "min_workers": "1", "max_workers": "2"}

    losses = client.get_metric_history(run.info.run_id, "loss")
    # Every report, the rolled-back steps 5 and 6 twice: MLflow keeps both, by time.
    assert sorted(m.step for m in losses) == sorted([*range(7), 5, 6, 7, 8, 9])
    world = sorted(client.get_metric_history(run.info.run_id, "world_size"), key=lambda m: m.timestamp)
    assert [m.value for m in world] == [2, 1, 2]
    resets = client.get_metric_history(run.info.run_id, "resets")
    assert max(m.value for m in resets) == 2

    events = [v for k, v in sorted(run.data.tags.items()) if k.startswith("elastrain.event.")]
    assert events == [
        "step 6: worker_exited: worker 1 on host-1 crashed: SIGKILL",
        "step 6: reset: reset 1: a new group of 1 workers",
        "step 7: reset: reset 2: a new group of 2 workers",
    ]
    text = Path(client.download_artifacts(run.info.run_id, "elastrain/events.txt", str(tmp_path))).read_text()
    assert text.splitlines() == events


def test_a_failed_run_is_failed_in_mlflow_with_why(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    uri = (tmp_path / "mlruns").as_uri()
    use(MLflowTracker(tracking_uri=uri))
    handle = TrackersObserver().start_run(run_record())
    assert handle is not None
    handle.metrics([{"step": 0, "values": {"loss": 1.0}, "time_ms": 1}])
    handle.failed("ElasticJobError: every worker died")

    client = MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("elastrain").experiment_id])  # the default experiment
    assert run.info.status == "FAILED"
    assert run.data.tags["elastrain.failure"] == "ElasticJobError: every worker died"
