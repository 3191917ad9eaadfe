"""An elastic worker ends as soon as its raylet (its parent process) is gone, not at Ray's next check.

A stand-in parent process starts a child that watches it; killing the parent must end the child, which says
why on its stderr. The child is the parent's only holder of the pipe, so its end shows as the pipe's end.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

from elastrain.executor._private import raylet_watch

CHILD = textwrap.dedent(
    """
    import os, sys
    from elastrain.executor._private import raylet_watch
    print("watching", flush=True)
    raylet_watch._watch(os.getppid())
    """
)
PARENT = textwrap.dedent(
    """
    import subprocess, sys, time
    subprocess.Popen([sys.executable, "-c", sys.argv[1]])
    time.sleep(600)
    """
)


def test_the_worker_exits_when_its_parent_dies() -> None:
    with subprocess.Popen(
        [sys.executable, "-c", PARENT, CHILD], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as parent:
        assert parent.stdout is not None
        assert parent.stderr is not None
        assert parent.stdout.readline().strip() == "watching"
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(timeout=30)
        # The child holds the pipes' write ends: they close when it exits.
        said = parent.stderr.read()
    assert "raylet" in said, said
    assert "exits now" in said, said


def test_no_watch_starts_outside_a_raylet_worker() -> None:
    # This test process's parent is pytest's launcher, not a raylet.
    assert raylet_watch.watch_raylet() is False
