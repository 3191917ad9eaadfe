"""Trackers are driven here as the executor drives them: through the observer entry point's run handle."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from elastrain.trackers import use


@pytest.fixture(autouse=True)
def no_trackers_left_in_use(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("ELASTRAIN_TRACKERS", raising=False)
    # A run's end waits for every tracker to take it all (a loaded machine makes W&B's finish take seconds);
    # the stalled-tracker test sets its own short deadline.
    monkeypatch.setenv("ELASTRAIN_TRACKERS_CLOSE_S", "120")
    yield
    use()  # back to none
    from elastrain.trackers._private import observer

    observer._in_use = None


def run_record(name: str = "train", world_size: int = 2) -> dict[str, object]:
    """What the executor hands observers as a run starts (``observers.run_record``, with the run's id)."""
    return {
        "id": "0123456789abcdef",
        "name": name,
        "job_id": "01000000",
        "controller_actor_id": None,
        "workers": [],
        "world_size": world_size,
        "min_workers": 1,
        "max_workers": 2,
    }


def worker(rank: int) -> dict[str, object]:
    return {"actor_id": f"a{rank}", "world_rank": rank, "local_rank": rank, "node_rank": 0, "node_id": "n",
            "node_ip": "127.0.0.1", "hostname": "host-1", "pid": 100 + rank, "gpu_ids": []}  # fmt: skip


def play_a_run_with_a_crash(handle: object) -> None:
    """10 steps of loss from 2 workers; worker 1 crashes after step 6, the job rolls back to its commit at step 5
    and goes on alone, then its replacement joins at step 8."""
    h: object = handle

    def report(step: int, loss: float) -> None:
        h.metrics([{"step": step, "values": {"loss": loss, "accuracy": step / 10}, "time_ms": 1_000 + step}])  # type: ignore[attr-defined]

    for step in range(7):
        report(step, 1.0 / (step + 1))
    h.event("worker_exited", {"worker": worker(1), "status": "CRASHED", "detail": "SIGKILL"})  # type: ignore[attr-defined]
    h.workers_changed([worker(0)], 1, 1)  # type: ignore[attr-defined]
    for step in range(5, 8):  # rolled back to the commit at step 5
        report(step, 0.9 / (step + 1))
    h.workers_changed([worker(0), worker(1)], 2, 2)  # type: ignore[attr-defined]
    for step in range(8, 10):
        report(step, 0.8 / (step + 1))
    h.finished()  # type: ignore[attr-defined]
