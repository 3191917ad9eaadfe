"""The main job, run as a user runs it with its output going to a log file: it trains, loses a worker as it
announced, recovers, and its output reads cleanly (progress lines, the announced crash, the summary with the
test accuracy; none of Ray's noise, no colour codes, no warnings)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

DEMO = Path(__file__).parent / "demo.py"


def test_the_demo_trains_through_an_announced_crash_and_reads_cleanly() -> None:
    done = subprocess.run(
        [sys.executable, str(DEMO), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=400,
        env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"},
    )
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert done.stderr == "", done.stderr
    lines = out.splitlines()

    announced = [i for i, line in enumerate(lines) if line.startswith("Step 50: crashing the worker of rank 1 now")]
    shrank = [i for i, line in enumerate(lines) if re.match(r"Step \d+: world size 2 -> 1 \(the survivor", line)]
    grew = [i for i, line in enumerate(lines) if re.match(r"Step \d+: world size 1 -> 2 \(a replacement", line)]
    assert len(announced) == len(shrank) == len(grew) == 1, out
    assert announced[0] < shrank[0] < grew[0], out

    progress = [line for line in lines if line.startswith("epoch ")]
    assert 6 <= len(progress) <= 11, out  # about one a epoch, not one a step
    assert progress[-1].startswith("epoch 10.0/10"), out

    accuracy = re.search(r"^  test accuracy +(\d+\.\d)% on 597 held-out digits$", out, re.MULTILINE)
    assert accuracy is not None, out
    assert float(accuracy[1]) > 85, out  # a model that learned (about 94% here)
    for label in ("crash -> next step", "crash -> replacement joined", "time lost to recovery"):
        assert re.search(rf"^  {label} +\d+\.\d\d s", out, re.MULTILINE), out
    assert re.search(r"^  checkpoints kept +3: steps ", out, re.MULTILINE), out
    assert re.search(r"^  tracked run +train: FINISHED, 2 resets", out, re.MULTILINE), out

    assert "\x1b" not in out, out  # no colour codes in a log
    for noise in ("(raylet)", "A worker died", "warning:", "Traceback", "INFO", "WARNING"):
        assert noise not in out, out
