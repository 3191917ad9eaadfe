"""Elastic state beyond the workers: a persistence hook that sees every commit, and a job whose every holder of
the committed state is lost (it fails, starts over where the user allowed it, or resumes from persisted state).

Failures are injected the way they happen: a worker exits hard at a step, or a fault point fires in a role.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import pytest
from elastic_training_kit import Recorder, batch_for, crash_if_marked, elastic_executor, last_step, make_model

from elastrain.discovery import StaticHostDiscovery
from elastrain.executor import RayExecutor, elastic, send
from elastrain.executor.elastic import ElasticJobError

# One Ray node whose fake resources stand for five hosts (conftest.py), shared by the module.
pytestmark = pytest.mark.usefixtures("ray_with_scripted_hosts")


class FolderPersistence:
    """The persistence protocol on a local folder (what elastrain-durable's StatePersistence implements)."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def committed(self, state: Any) -> None:
        Path(self.folder, "committed").write_text(str(state.commit_count))

    def latest(self) -> str | None:
        return None

    def load(self, name: str) -> tuple[Any, int]:
        raise AssertionError("nothing was persisted before this job")

    def flush(self) -> None:
        Path(self.folder, "flushed").write_text("yes")

    def rank_changed(self, rank: int) -> None:  # optional: told at every sync, so a former rank 0 can step back
        Path(self.folder, f"rank-{rank}").touch()


def train_persisted(folder: str) -> int:
    import torch.distributed as dist

    state = elastic.ObjectState(step=0, commits=0)  # a user value named like the bookkeeping
    state.persist_with(FolderPersistence(folder))

    @elastic.run
    def loop(state: elastic.ObjectState) -> int:
        while state.step < 5:
            dist.barrier()
            state.step += 1
            state.commit()
        return state.commit_count

    return loop(state)


def test_persistence_sees_every_commit_and_is_flushed_at_the_end(tmp_path: Path) -> None:
    discovery = StaticHostDiscovery("host-1:2")
    with elastic_executor(discovery, min_workers=2, max_workers=2) as executor:
        executor.start()
        assert executor.run(train_persisted, args=[str(tmp_path)]) == [5, 5]
    assert (tmp_path / "committed").read_text() == "5"
    assert (tmp_path / "flushed").read_text() == "yes"
    assert sorted(p.name for p in tmp_path.glob("rank-*")) == ["rank-0", "rank-1"]


class PicklingPersistence:
    """Keeps every committed snapshot as a pickle in a folder (what elastrain-durable does, in short)."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def committed(self, state: Any) -> None:
        path = Path(self.folder, f"{state.commit_count:08d}.pkl")
        path.with_suffix(".tmp").write_bytes(pickle.dumps((state.snapshot(), state.commit_count)))
        path.with_suffix(".tmp").replace(path)

    def latest(self) -> str | None:
        names = sorted(p.name for p in Path(self.folder).glob("*.pkl"))
        return names[-1] if names else None

    def load(self, name: str) -> tuple[Any, int]:
        snapshot, commits = pickle.loads(Path(self.folder, name).read_bytes())  # noqa: S301 - this test's own files
        return snapshot, int(commits)

    def flush(self) -> None:
        pass


def train_and_crash(steps: str, crash_dir: str, persist_to: str | None = None) -> list[int]:
    """A model and a step count, committed at every step (and persisted, with ``persist_to``); a rank exits hard
    where a ``crash-<rank>-<step>`` file says. Returns the step of every entry into the loop."""
    import torch
    import torch.distributed as dist

    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    state = elastic.TorchState(model, optimizer, step=0)
    if persist_to is not None:
        state.persist_with(PicklingPersistence(persist_to))
    entries: list[int] = []

    @elastic.run
    def loop(state: elastic.TorchState) -> list[int]:
        entries.append(int(state.step))
        while state.step < last_step(steps):
            crash_if_marked(crash_dir, dist.get_rank(), state.step)
            inputs, targets = batch_for(state.step)
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(inputs), targets).backward()
            for p in model.parameters():
                dist.all_reduce(p.grad)
            optimizer.step()
            state.step += 1
            send({"event": "step", "step": state.step, "size": dist.get_world_size()})
            state.commit()
        return entries

    return loop(state)


def lose_the_last_holder(
    tmp_path: Path, start_over: bool, persist: bool = False
) -> tuple[list[Any], BaseException | None, Recorder]:
    """Two workers; rank 1 crashes at step 4; the survivor (group 2, alone) dies as the source of the sync to its
    replacement (group 3) once the first tensors went out: no worker holds the committed state any more."""
    crash_dir = tmp_path / "crash"
    crash_dir.mkdir()
    (crash_dir / "crash-1-4").touch()
    faults_file = tmp_path / "faults.json"
    spec = {"point": "sync_mid", "role": "source", "action": "crash", "at": 1, "min_generation": 3}
    faults_file.write_text(json.dumps([{**spec, "marker": str(tmp_path / "fired")}]))
    stop_file = tmp_path / "stop"
    discovery = StaticHostDiscovery("host-1:1,host-2:1")
    recorder = Recorder(discovery, [(lambda m: (tmp_path / "fired").exists(), None)], stop_file, final_size=2)
    settings = RayExecutor.create_settings(
        timeout_s=60, discovery=discovery, discovery_interval_s=0.05, start_over_on_state_loss=start_over
    )
    results: list[Any] = []
    error: BaseException | None = None
    with RayExecutor(
        settings, override_discovery=False, cpus_per_worker=0.25, min_workers=1, max_workers=2, elastic_timeout=60
    ) as executor:
        executor.start(extra_env_vars={"ELASTRAIN_FAULTS": str(faults_file)})
        try:
            persist_to = tmp_path / "persisted" if persist else None
            if persist_to is not None:
                persist_to.mkdir()
            args = [str(stop_file), str(crash_dir), persist_to and str(persist_to)]
            results = executor.run(train_and_crash, args=args, callbacks=[recorder])
        except Exception as raised:  # the test judges what was raised
            error = raised
    fired = json.loads((tmp_path / "fired").read_text())
    assert (fired["generation"], fired["role"]) == (3, "source"), fired
    assert not (crash_dir / "crash-1-4").exists()
    return results, error, recorder


def test_losing_every_holder_of_the_state_fails_the_job_instead_of_starting_over(tmp_path: Path) -> None:
    results, error, recorder = lose_the_last_holder(tmp_path, start_over=False)
    assert error is not None, f"the job finished after losing its state: {results}"
    assert type(error) is ElasticJobError, repr(error)  # the workers' verdict, as the job's own error
    text = str(error)
    assert "committed state was lost with its last holder(s)" in text, text
    assert "start_over_on_state_loss=True" in text
    assert "StatePersistence" in text
    assert max(m["step"] for m in recorder.events("step")) >= 4


def test_losing_every_holder_starts_over_where_the_user_allowed_it(tmp_path: Path) -> None:
    results, error, recorder = lose_the_last_holder(tmp_path, start_over=True)
    assert error is None, repr(error)
    assert len(results) == 2
    assert min(entries[0] for entries in results) == 0, f"no worker started over: {results}"
    steps = [m["step"] for m in recorder.events("step")]
    assert any(step == 1 and max(steps[:i]) >= 4 for i, step in enumerate(steps) if i), f"trained from 0? {steps}"


def test_losing_every_holder_resumes_from_the_persisted_state(tmp_path: Path) -> None:
    results, error, recorder = lose_the_last_holder(tmp_path, start_over=False, persist=True)
    assert error is None, repr(error)
    assert len(results) == 2
    assert min(entries[0] for entries in results) >= 4, f"a worker started over: {results}"
    assert max(m["step"] for m in recorder.events("step")) >= 10


def commit_once_then_exit(crash_dir: str) -> int:
    """Exits hard right after the job's first commit (a ``crash-0-1`` file), well within a heartbeat of it."""
    state = elastic.ObjectState(step=0)

    @elastic.run
    def loop(state: elastic.ObjectState) -> int:
        while state.step < 3:
            state.step += 1
            state.commit()
            crash_if_marked(crash_dir, 0, state.step)
        return int(state.step)

    return loop(state)


def test_the_job_s_first_commit_is_known_before_its_only_holder_can_be_lost(crash_dir: Path) -> None:
    # The rendezvous actor hears of commits with heartbeats (every second here) and arrivals; the first one is told
    # before commit() returns, so its replacement sees the state lost instead of silently starting afresh.
    (crash_dir / "crash-0-1").touch()
    discovery = StaticHostDiscovery("host-1:1,host-2:1")
    with elastic_executor(discovery, min_workers=1, max_workers=1) as executor:
        executor.start()
        with pytest.raises(ElasticJobError, match="committed state was lost with its last holder"):
            executor.run(commit_once_then_exit, args=[str(crash_dir)])
    assert not (crash_dir / "crash-0-1").exists()
