"""A run with a crash and a replacement in W&B's offline mode (no network), read back from its run file."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import play_a_run_with_a_crash, run_record

from elastrain.trackers import TrackersObserver, WandbTracker, use

# W&B's run file is a log of protobuf records in LevelDB's log format: 32 KiB blocks, each record a 7-byte header
# (checksum, length, kind: 1 whole, 2 first, 3 middle, 4 last part) and its bytes, after a 7-byte file header.
_BLOCK = 32_768
_HEADER = 7


def wandb_records(path: Path) -> Iterator[Any]:
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    position, pending = _HEADER, b""
    while position + _HEADER <= len(data):
        left = _BLOCK - position % _BLOCK
        if left < _HEADER:  # a block's tail too short for a header is padding
            position += left
            continue
        length, kind = int.from_bytes(data[position + 4 : position + 6], "little"), data[position + 6]
        pending += data[position + _HEADER : position + _HEADER + length]
        position += _HEADER + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def test_the_run_its_losses_world_size_and_events_are_in_the_offline_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WANDB_SILENT", "true")
    use(WandbTracker(project="elastic", mode="offline", dir=str(tmp_path)))
    handle = TrackersObserver().start_run(run_record())
    assert handle is not None
    play_a_run_with_a_crash(handle)

    (run_file,) = tmp_path.glob("wandb/offline-run-*/run-*.wandb")
    # W&B's service may still be writing the file when the run's end returns: read it once it holds the run's exit.
    deadline = time.monotonic() + 60
    while not any(r.WhichOneof("record_type") == "exit" for r in wandb_records(run_file)):
        assert time.monotonic() < deadline, f"{run_file} never got the run's exit record"
        time.sleep(0.1)
    history: list[dict[str, Any]] = []
    summary: dict[str, Any] = {}
    config: dict[str, Any] = {}
    exit_code = None
    for record in wandb_records(run_file):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            history.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                            for item in record.history.item})  # fmt: skip
        elif kind == "summary":
            summary.update({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                            for item in record.summary.update})  # fmt: skip
        elif kind == "run":
            config = {item.key: json.loads(item.value_json) for item in record.run.config.update}
        elif kind == "exit":
            exit_code = record.exit.exit_code

    losses = [(row["trainer/step"], row["loss"]) for row in history if "loss" in row]
    assert [step for step, _ in losses] == [*range(7), 5, 6, 7, 8, 9]
    assert losses[-1] == (9, 0.08)
    assert [row["world_size"] for row in history if "world_size" in row] == [2, 1, 2]
    assert {k: config[k] for k in ("world_size", "min_workers", "max_workers")} == {
        "world_size": 2, "min_workers": 1, "max_workers": 2,
    }  # fmt: skip
    assert summary["elastrain/status"] == "FINISHED"
    assert summary["elastrain/events/nrows"] == 3  # the crash and the two resets
    assert exit_code == 0
