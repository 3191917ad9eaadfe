"""A run with a crash and a replacement, as TensorBoard's own reader reads its event files."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import play_a_run_with_a_crash, run_record

from elastrain.trackers import RunInfo, TensorBoardTracker, TrackersObserver, use


def test_the_scalars_and_events_are_in_the_event_files(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tracker = TensorBoardTracker(log_dir=tmp_path)
    use(tracker)
    handle = TrackersObserver().start_run(run_record())
    assert handle is not None
    play_a_run_with_a_crash(handle)

    run_dir = tracker.run_dir(RunInfo.of(run_record()))
    assert run_dir.parent == tmp_path
    assert run_dir.name == "train-0123456789ab"
    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    losses = events.Scalars("loss")
    assert [s.step for s in losses] == [*range(7), 5, 6, 7, 8, 9]
    assert losses[-1].value == pytest.approx(0.8 / 10)  # TensorBoard keeps float32
    assert [s.value for s in events.Scalars("world_size")] == [2, 1, 2]
    assert [s.value for s in events.Scalars("resets")] == [0, 1, 2]
    texts = {
        tag: [t.tensor_proto.string_val[0].decode() for t in events.Tensors(tag)] for tag in events.Tags()["tensors"]
    }
    assert texts["events/worker_exited/text_summary"] == ["worker 1 on host-1 crashed: SIGKILL"]
    assert texts["events/reset/text_summary"] == [
        "reset 1: a new group of 1 workers",
        "reset 2: a new group of 2 workers",
    ]
    assert texts["status/text_summary"] == ["FINISHED"]
