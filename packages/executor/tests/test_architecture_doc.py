"""docs/architecture.md draws the driver's two state machines; the drawings must be the code's transition tables,
and an illegal transition must raise under the strict protocol and be logged otherwise."""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from enum import Enum
from pathlib import Path

import pytest

from elastrain.executor._private.elastic.driver.lifecycle import (
    JOB_TRANSITIONS,
    WORKER_TRANSITIONS,
    IllegalTransition,
    JobPhase,
    WorkerPhase,
    move,
)

DOC = Path(__file__).resolve().parents[3] / "docs" / "architecture.md"


def drawn(name: str) -> set[tuple[str, str]]:
    text = DOC.read_text()
    block = re.search(rf"<!-- {name}: begin -->(.*?)<!-- {name}: end -->", text, re.S)
    assert block is not None, f"docs/architecture.md has no {name} diagram"
    edges = re.findall(r"^\s*(\w+) --> (\w+)\s*$", block.group(1), re.M)
    return {(a, b) for a, b in edges}


def tabled(table: Mapping[Enum, frozenset[Enum]]) -> set[tuple[str, str]]:
    return {(str(a.value), str(b.value)) for a, targets in table.items() for b in targets}


@pytest.mark.parametrize(
    ("name", "table"), [("job-transitions", JOB_TRANSITIONS), ("worker-transitions", WORKER_TRANSITIONS)]
)
def test_the_diagram_is_the_transition_table(name: str, table: Mapping[Enum, frozenset[Enum]]) -> None:
    assert drawn(name) == tabled(table), f"update the {name} diagram in docs/architecture.md"


def test_every_phase_of_each_machine_is_in_its_table() -> None:
    assert set(JOB_TRANSITIONS) == set(JobPhase)
    assert set(WORKER_TRANSITIONS) == set(WorkerPhase)
    assert all(targets <= set(JobPhase) for targets in JOB_TRANSITIONS.values())


def test_an_illegal_transition_raises_when_strict_and_is_logged_otherwise(caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(IllegalTransition, match="finished → running"):
        move(JobPhase.FINISHED, JobPhase.RUNNING, what="the job", strict=True)
    with caplog.at_level(logging.ERROR, logger="elastrain.executor"):
        assert move(WorkerPhase.GONE, WorkerPhase.MEMBER, what="worker w1", strict=False) is WorkerPhase.MEMBER
    assert "Illegal transition of worker w1: gone → member" in caplog.text
