"""Workers that stop without dying: frozen, stuck, busy, leaving, or dying after the others finished.

One Ray node with scripted hosts (fake ``node:host-N`` resources), as in ``test_elastic.py``. Each job is a
``min_workers=1`` group of two that trains with an allreduce and a commit per step; the test makes one worker
misbehave once (a marker file records that it did) and checks what the driver did about it from its log and the
workers' messages. No test waits on a sleep to see an effect: the bounds asserted are the settings' own.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from elastrain.discovery import StaticHostDiscovery
from elastrain.executor import RayExecutor, elastic, send
from elastrain_testutils.ray_testing import local_ray

HOSTS = {f"node:host-{n}": 100 for n in range(1, 4)}
LIVENESS_S = 3.0
# Long enough that a survivor going on proves the liveness check, not a collective timeout, let it.
COLLECTIVE_TIMEOUT_S = 120.0
MISBEHAVE_AT = 8


@pytest.fixture(scope="module", autouse=True)
def ray_with_scripted_hosts() -> Iterator[None]:
    with local_ray(num_cpus=4, resources=HOSTS):
        yield


def executor_for(hosts: str, **settings: Any) -> tuple[RayExecutor, StaticHostDiscovery]:
    discovery = StaticHostDiscovery(hosts)
    settings.setdefault("liveness_timeout_s", LIVENESS_S)
    settings.setdefault("collective_timeout_s", COLLECTIVE_TIMEOUT_S)
    made = RayExecutor.create_settings(timeout_s=60, discovery=discovery, discovery_interval_s=0.05, **settings)
    executor = RayExecutor(
        made, override_discovery=False, min_workers=1, max_workers=2, cpus_per_worker=0.25, elastic_timeout=60
    )
    return executor, discovery


def train(steps: int, marker: str, misbehaviour: str) -> int:
    """``steps`` allreduce-and-commit steps; rank 1 misbehaves once at MISBEHAVE_AT (recorded in ``marker``)."""
    import torch
    import torch.distributed as dist

    state = elastic.ObjectState(step=0)

    @elastic.run
    def loop(state: elastic.ObjectState) -> int:
        while state.step < steps:
            rank, size = dist.get_rank(), dist.get_world_size()
            if rank == 1 and state.step == MISBEHAVE_AT and not os.path.exists(marker):
                Path(marker).write_text(f"{os.getpid()} {time.time()}")
                if misbehaviour == "freeze":
                    # Sent to this thread, not to the process. This function runs on one of the actor's threads
                    # (it has concurrency groups); the kernel hands a process-directed SIGSTOP to the main thread,
                    # and until that thread has run the group stop, this one goes on: on a busy machine for a
                    # few ms, into step 9's allreduce, whose peer then completes a step of size 2 after the
                    # freeze. A thread-directed SIGSTOP stops this thread at once, and the whole process with it.
                    signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)
                elif misbehaviour == "hang":  # alive (its heartbeat goes on) but never reaches a collective
                    time.sleep(3600)
            if rank == 0 and misbehaviour == "busy" and state.step == MISBEHAVE_AT and not os.path.exists(marker):
                Path(marker).write_text(f"{os.getpid()} {time.time()}")
                # A rank-0-only phase longer than the liveness timeout, partly holding the GIL, while rank 1
                # waits in the allreduce below.
                deadline = time.monotonic() + 3 * LIVENESS_S
                while time.monotonic() < deadline:
                    sum(range(10_000))
            time.sleep(0.02)  # a step takes a moment, as real ones do: a new group's notice lands in milliseconds
            value = torch.ones(1)
            dist.all_reduce(value)
            assert value.item() == size
            state.step += 1
            restarts = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))  # set for each group this worker joins
            send(
                {
                    "t": time.time(),
                    "step": state.step,
                    "size": size,
                    "rank": rank,
                    "pid": os.getpid(),
                    "restarts": restarts,
                }
            )
            state.commit()
        return int(state.step)

    return int(loop(state))


def run_job(executor: RayExecutor, *args: Any) -> tuple[list[Any], list[dict[str, Any]]]:
    messages: list[dict[str, Any]] = []
    with executor:
        executor.start()
        results = executor.run(train, args=list(args), callbacks=[messages.append])
    return results, messages


def frozen_at(marker: Path) -> tuple[int, float]:
    pid, at = marker.read_text().split()
    return int(pid), float(at)


def warnings_from(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_frozen_worker_is_evicted_and_the_survivor_goes_on(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    marker = tmp_path / "frozen"
    executor, _ = executor_for("host-1:2")
    with caplog.at_level(logging.INFO, logger="elastrain.executor"):
        results, messages = run_job(executor, 40, str(marker), "freeze")
    pid, at = frozen_at(marker)
    assert set(results) == {40}  # the survivor (and a replacement, if it joined before the end)
    evictions = [w for w in warnings_from(caplog) if w.startswith("Evicting worker") and "no heartbeat" in w]
    assert len(evictions) == 1
    # Steps after the frozen one: rank 0 may still be sending the step before it when rank 1 freezes.
    after = sorted((m for m in messages if m["t"] > at and m["step"] > MISBEHAVE_AT), key=lambda m: m["t"])
    # A string, not a tuple: pytest shortens the repr of a tuple.
    around = "\n".join(str(m) for m in messages if m["step"] >= MISBEHAVE_AT - 1)
    explained = f"rank 1 (pid {pid}) froze at {at}; messages from step {MISBEHAVE_AT - 1} on:\n{around}"
    # The survivor's next step is trained in a group formed after the freeze, without the frozen worker: alone,
    # or, when the replacement was ready before the frozen process was gone, with the replacement.
    survivor = next(m["pid"] for m in messages if m["t"] <= at and m["pid"] != pid)
    groups_at_freeze = max(m["restarts"] for m in messages if m["pid"] == survivor and m["t"] <= at)
    survivors_next = next(m for m in after if m["pid"] == survivor)
    assert survivors_next["restarts"] > groups_at_freeze, explained
    assert survivors_next["t"] - at < COLLECTIVE_TIMEOUT_S  # not freed by the collective timeout
    assert pid not in {m["pid"] for m in after}
    with pytest.raises(ProcessLookupError):  # killed (SIGKILL works on a stopped process) and reaped
        os.kill(pid, 0)


def test_a_worker_stuck_while_alive_is_evicted_when_it_never_arrives(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    marker = tmp_path / "hung"
    # Its heartbeat goes on: the collective timeout frees its peer, and its absence from the next group evicts it.
    executor, _ = executor_for("host-1:2", collective_timeout_s=4.0)
    with caplog.at_level(logging.INFO, logger="elastrain.executor"):
        results, _ = run_job(executor, 30, str(marker), "hang")
    assert set(results) == {30}
    warnings = warnings_from(caplog)
    assert any(w.startswith("Evicting worker") and "did not arrive" in w for w in warnings)
    assert not any("no heartbeat" in w for w in warnings)


def test_a_busy_worker_is_never_evicted(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    executor, _ = executor_for("host-1:2")
    with caplog.at_level(logging.INFO, logger="elastrain.executor"):
        results, messages = run_job(executor, 20, str(tmp_path / "busy"), "busy")
    assert results == [20, 20]
    assert not [w for w in warnings_from(caplog) if "Evicting" in w or "died" in w or "failed" in w]
    assert {m["size"] for m in messages} == {2}
    assert len({m["pid"] for m in messages}) == 2  # the same two workers throughout


def steady_then_drop_host(discovery: StaticHostDiscovery, messages: list[dict[str, Any]]) -> Any:
    def callback(message: dict[str, Any]) -> None:
        messages.append(message)
        if message["step"] == MISBEHAVE_AT and message["size"] == 2:
            discovery.set_hosts("host-1:1")

    return callback


def test_a_removed_host_leaves_at_the_next_commit_without_a_rollback(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    executor, discovery = executor_for("host-1:1,host-2:1")
    messages: list[dict[str, Any]] = []
    with caplog.at_level(logging.INFO, logger="elastrain.executor"), executor:
        executor.start()
        results = executor.run(
            train, args=[30, str(tmp_path / "unused"), "none"], callbacks=[steady_then_drop_host(discovery, messages)]
        )
    assert results == [30]
    assert any("leaves at its next commit" in r.getMessage() for r in caplog.records)
    assert not [w for w in warnings_from(caplog) if "died" in w or "failed" in w or "Evicting" in w]
    survivor = max({m["pid"] for m in messages if m["size"] == 1})
    steps = [m["step"] for m in messages if m["pid"] == survivor]
    assert steps == sorted(set(steps)) == list(range(1, 31))  # every step once: nothing rolled back


def die_after_the_others_finished(marker: str) -> int:
    import torch
    import torch.distributed as dist

    state = elastic.ObjectState(step=0)

    @elastic.run
    def loop(state: elastic.ObjectState) -> int:
        while state.step < 10:
            dist.all_reduce(torch.ones(1))
            state.step += 1
            state.commit()
        return dist.get_rank()

    rank = int(loop(state))
    if rank == 1:
        while not os.path.exists(marker):  # rank 0 has returned its result
            time.sleep(0.01)
        os._exit(1)
    Path(marker).write_text("finished")
    return rank


def test_a_death_after_another_worker_finished_ends_the_call_with_the_results_there_are(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    executor, _ = executor_for("host-1:2")
    with caplog.at_level(logging.INFO, logger="elastrain.executor"), executor:
        executor.start()
        results = executor.run(die_after_the_others_finished, args=[str(tmp_path / "rank0-done")])
    assert results == [0]
    assert any("ended without a result after the others finished" in w for w in warnings_from(caplog))


def commit_every(gap_s: float, steps: int) -> int:
    import torch
    import torch.distributed as dist

    state = elastic.ObjectState(step=0)

    @elastic.run
    def loop(state: elastic.ObjectState) -> int:
        while state.step < steps:
            dist.all_reduce(torch.ones(1))
            state.step += 1
            send({"step": state.step, "size": dist.get_world_size()})
            time.sleep(gap_s)
            state.commit()
        return int(state.step)

    return int(loop(state))


def test_a_job_whose_commits_are_rarer_than_elastic_timeout_still_grows() -> None:
    discovery = StaticHostDiscovery("host-1:1")
    settings = RayExecutor.create_settings(timeout_s=60, discovery=discovery, discovery_interval_s=0.05)
    messages: list[dict[str, Any]] = []

    def grow_after_the_first_step(message: dict[str, Any]) -> None:
        messages.append(message)
        if message["step"] == 1:
            discovery.set_hosts("host-1:1,host-2:1")

    with RayExecutor(
        settings, override_discovery=False, min_workers=1, max_workers=2, cpus_per_worker=0.25, elastic_timeout=1
    ) as executor:
        executor.start()
        # In its group's barrier the newcomer waits for the next commit (one every 6 s): longer than
        # elastic_timeout, which bounds only the time below min_workers.
        results = executor.run(commit_every, args=[6.0, 3], callbacks=[grow_after_the_first_step])
    assert results == [3, 3]
    assert messages[-1]["size"] == 2


def test_beats_spread_out_as_a_job_grows_but_never_past_a_quarter_of_the_timeout() -> None:
    from elastrain.executor._private.elastic.worker.heartbeat import JOB_BEATS_PER_S, beat_interval

    assert beat_interval(8.0) == 2.0  # the default timeout: a beat every 2 s
    assert beat_interval(3.0, world_size=2) == 0.75  # a quarter of a short timeout
    assert beat_interval(30.0, world_size=64) == 2.0  # small jobs: at most 2 s apart
    # 1,024 workers with a 30 s timeout: the job's beats stay near the rendezvous actor's budget...
    assert 1024 / beat_interval(30.0, world_size=1024) == pytest.approx(JOB_BEATS_PER_S)
    # ... but silence is never misread: with the default 8 s timeout a beat still comes every 2 s.
    assert beat_interval(8.0, world_size=1024) == 2.0
