"""Fault points: free when unarmed; armed by a file, each spec fires once across processes and does what it says.

Processes here are plain Python children (no Ray, no torch): the module needs neither.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import timeit
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from elastrain.executor._private.elastic.worker import faults

MODULE_FILE = faults.__file__
CHILD_TIMEOUT_S = 30.0


def armed_module(monkeypatch: pytest.MonkeyPatch, specs: Any, tmp_path: Path) -> ModuleType:
    """A fresh copy of the fault module, imported with ``ELASTRAIN_FAULTS`` naming a file holding ``specs``."""
    path = tmp_path / "faults.json"
    path.write_text(specs if isinstance(specs, str) else json.dumps(specs))
    monkeypatch.setenv(faults.ENV_VAR, str(path))
    loader = importlib.util.spec_from_file_location("armed_faults_under_test", MODULE_FILE)
    assert loader is not None
    assert loader.loader is not None
    module = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(module)
    return module


def spec(marker: Path, **fields: Any) -> dict[str, Any]:
    return {"point": "finish", "role": "any", "action": "raise", "min_generation": 0, "marker": str(marker), **fields}


def child(faults_file: Path, body: str) -> subprocess.Popen[str]:
    """A Python child with the fault file armed, running ``body`` after importing ``fault_point``."""
    code = "from elastrain.executor._private.elastic.worker.faults import fault_point\n" + textwrap.dedent(body)
    env = {**os.environ, faults.ENV_VAR: str(faults_file)}
    return subprocess.Popen(
        [sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def test_an_unarmed_point_costs_no_more_than_an_empty_call() -> None:
    assert faults.ENV_VAR not in os.environ
    assert faults.fault_point is faults._unarmed_fault_point

    def empty(name: str, **context: object) -> None:
        pass

    def best_of(function: Any) -> float:
        return min(timeit.repeat(lambda: function("sync_mid", done=3), number=20_000, repeat=7)) / 20_000

    point, baseline = best_of(faults.fault_point), best_of(empty)
    assert point < 1e-6, f"an unarmed fault point took {point * 1e9:.0f} ns"
    assert point < 2 * baseline + 50e-9, f"{point * 1e9:.0f} ns against {baseline * 1e9:.0f} ns for an empty call"


def test_the_module_declares_every_point_and_role() -> None:
    assert set(faults.ROLES_AT) == set(faults.POINTS)
    assert faults.ROLES == ("source", "survivor_at_commit", "survivor_between_commits", "newcomer", "any")
    for point in ("join", "pg_init", "reset_callbacks"):  # before the source is known
        assert set(faults.ROLES_AT[point]) == {"survivor_at_commit", "survivor_between_commits", "newcomer"}
    assert set(faults.ROLES_AT["persist_handoff"]) == {"source", "newcomer"}  # rank 0 only
    assert all("any" not in roles and set(roles) <= set(faults.ROLES) for roles in faults.ROLES_AT.values())


def test_a_spec_fires_once_across_two_processes(tmp_path: Path) -> None:
    marker = tmp_path / "fired"
    faults_file = tmp_path / "faults.json"
    faults_file.write_text(json.dumps([spec(marker)]))
    body = """
        import time
        time.sleep(0.2)  # both children are up: they race for the marker
        for _ in range(3):
            fault_point("finish", generation=1)
    """
    children = [child(faults_file, body) for _ in range(2)]
    outputs = [c.communicate(timeout=CHILD_TIMEOUT_S) for c in children]
    codes = sorted(c.returncode for c in children)
    assert codes == [0, 1], outputs
    raised = next(c for c in children if c.returncode == 1)
    stderr = next(err for c, (_, err) in zip(children, outputs, strict=True) if c is raised)
    assert "InjectedFault: fault injected at 'finish' on a worker in role 'newcomer'" in stderr
    lines = marker.read_text().splitlines()
    assert len(lines) == 1
    record = json.loads(lines[0])
    assert set(record) == {"point", "role", "action", "worker_id", "pid", "rank", "generation", "time"}
    assert (record["point"], record["role"], record["action"]) == ("finish", "newcomer", "raise")
    assert record["pid"] == raised.pid
    assert record["generation"] == 1
    assert abs(record["time"] - time.time()) < 60


def test_crash_kills_the_process_after_recording_it(tmp_path: Path) -> None:
    marker = tmp_path / "fired"
    faults_file = tmp_path / "faults.json"
    faults_file.write_text(json.dumps([spec(marker, point="sync_mid", role="source", action="crash", at=2)]))
    body = """
        import sys
        for done in (1, 2, 3):
            print(done, flush=True)
            fault_point("sync_mid", done=done, role="source", generation=2)
        sys.exit(0)
    """
    process = child(faults_file, body)
    out, _ = process.communicate(timeout=CHILD_TIMEOUT_S)
    assert process.returncode == -signal.SIGKILL
    assert out.split() == ["1", "2"], "it fired once two units were done"
    assert json.loads(marker.read_text())["action"] == "crash"


def test_freeze_stops_the_process(tmp_path: Path) -> None:
    marker = tmp_path / "fired"
    faults_file = tmp_path / "faults.json"
    faults_file.write_text(json.dumps([spec(marker, point="join", role="newcomer", action="freeze")]))
    process = child(faults_file, 'fault_point("join", generation=1)\nprint("went on")')
    try:
        deadline = time.monotonic() + CHILD_TIMEOUT_S
        while _process_state(process.pid) != "T":
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "the child never stopped"
            time.sleep(0.02)
        assert json.loads(marker.read_text())["pid"] == process.pid
    finally:
        process.kill()
        out, _ = process.communicate(timeout=CHILD_TIMEOUT_S)
    assert "went on" not in out


def _process_state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0]


def test_raise_matches_role_generation_and_pass(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    marker = tmp_path / "fired"
    module = armed_module(
        monkeypatch, [spec(marker, point="commit_copy_mid", role="survivor_at_commit", min_generation=3)], tmp_path
    )
    point = module.fault_point
    point("commit_copy_mid", done=1, role="newcomer", generation=3)  # another role
    point("commit_copy_mid", done=1, role="survivor_at_commit", generation=2)  # too early
    point("sync_mid", done=1, role="survivor_at_commit", generation=3)  # another point
    assert not marker.exists()
    with pytest.raises(module.InjectedFault, match="'commit_copy_mid' on a worker in role 'survivor_at_commit'"):
        point("commit_copy_mid", done=1, role="survivor_at_commit", generation=3)
    assert not isinstance(module.InjectedFault("x"), ConnectionError)
    point("commit_copy_mid", done=1, role="survivor_at_commit", generation=4)  # fired once: no more


def test_at_counts_passes_at_other_points(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    marker = tmp_path / "fired"
    module = armed_module(monkeypatch, [spec(marker, point="pg_init", at=2)], tmp_path)
    module.fault_point("pg_init", generation=1)
    module.fault_point("pg_init", generation=1)
    with pytest.raises(module.InjectedFault):
        module.fault_point("pg_init", generation=1)


def test_a_marker_made_elsewhere_means_fired(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    marker = tmp_path / "fired"
    marker.write_text("{}\n")
    module = armed_module(monkeypatch, [spec(marker)], tmp_path)
    module.fault_point("finish", generation=1)


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ("{not json", "could not be read as JSON"),
        ('{"point": "join"}', "must hold a JSON list of specs"),
        ([{"point": "sync_middle", "role": "any", "action": "crash", "marker": "m"}], "use one of \\['join'"),
        ([{"point": "join", "role": "source", "action": "crash", "marker": "m"}], "role 'source' never occurs at"),
        ([{"point": "join", "role": "any", "action": "explode", "marker": "m"}], "use one of \\['crash', 'freeze'"),
        ([{"point": "join", "role": "any", "action": "crash"}], "lacks \\['marker'\\]; add them"),
        ([{"point": "join", "role": "any", "action": "crash", "marker": "m", "when": 1}], r"unknown key\(s\) \['when'"),
        ([{"point": "join", "role": "any", "action": "crash", "marker": "m", "at": -1}], "at must be a whole number"),
    ],
)
def test_a_bad_fault_file_says_what_to_change(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, content: Any, says: str
) -> None:
    with pytest.raises(ValueError, match=says) as raised:  # the fresh module's own FaultSpecError
        armed_module(monkeypatch, content, tmp_path)
    assert type(raised.value).__name__ == "FaultSpecError"
    assert str(tmp_path / "faults.json") in str(raised.value)


def test_the_public_testing_module_names_the_fault_points() -> None:
    from elastrain.executor import testing

    assert testing.POINTS == faults.POINTS
    assert testing.ROLES_AT == faults.ROLES_AT
    assert testing.FAULTS_ENV == faults.ENV_VAR == "ELASTRAIN_FAULTS"
    assert testing.InjectedFault is faults.InjectedFault
    assert sorted(testing.__all__) == sorted(name for name in dir(testing) if name.isupper() or name[0].isupper())
