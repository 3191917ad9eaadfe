"""What a user reads when a worker fails: its traceback once, plain text in a log, public class names."""

from __future__ import annotations

import itertools
import os
import pickle
import subprocess
import sys
import textwrap

import pytest

from elastrain.executor import WorkerDiedError, WorkerError, elastic
from elastrain.executor._private.tracebacks import clean_traceback
from elastrain_testutils.packaging import assert_exceptions_named_publicly

# A failing static call, caught and printed, then a failing elastic call left uncaught: what a script's user
# sees in a log file (stderr is a pipe here, not a terminal).
SCRIPT = """
import sys
import traceback

import ray

from elastrain.executor import RayExecutor, elastic


def fails_in_a_helper():
    raise ValueError("static failure 6481")


def static_job():
    fails_in_a_helper()


def elastic_job():
    @elastic.run
    def loop(state):
        raise KeyError("elastic failure 7193")

    return loop(elastic.ObjectState(step=0))


# Ray's own log lines stay out, so that stderr holds only what the executor raised.
ray.init(
    address="local", num_cpus=1, include_dashboard=False, object_store_memory=80 * 1024 * 1024, log_to_driver=False
)
settings = RayExecutor.create_settings(timeout_s=60)
with RayExecutor(settings, num_workers=1, cpus_per_worker=0.5) as executor:
    executor.start()
    try:
        executor.run(static_job)
    except Exception:
        traceback.print_exc()
print("=== elastic", file=sys.stderr, flush=True)
with RayExecutor(settings, min_workers=1, max_workers=1, cpus_per_worker=0.5) as executor:
    executor.start()
    executor.run(elastic_job)
"""


@pytest.fixture(scope="module")
def failure_output(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """stderr of the script, split into the static and the elastic failure."""
    script = tmp_path_factory.mktemp("failing") / "failing_job.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=240, env=env, cwd=script.parent
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "=== elastic" in done.stderr, done.stdout + done.stderr
    static, _, elastic = done.stderr.partition("=== elastic")
    return static, elastic


def test_a_worker_traceback_is_shown_once(failure_output: tuple[str, str]) -> None:
    static, elastic = failure_output
    for text, source_line, error_line in [
        (static, 'raise ValueError("static failure 6481")', "ValueError: static failure 6481"),
        (elastic, 'raise KeyError("elastic failure 7193")', "KeyError: 'elastic failure 7193'"),
    ]:
        assert text.count(source_line) == 1, text
        assert text.count(error_line) == 1, text
        assert "The above exception was the direct cause" not in text, text


def test_the_traceback_is_plain_text_without_stray_markers(failure_output: tuple[str, str]) -> None:
    for text in failure_output:
        assert "\x1b" not in text, text  # no ANSI colour codes in a log
        assert "ray::" not in text, text  # Ray's header, replaced by Python's
        lines = text.splitlines()
        for before, line in itertools.pairwise(lines):
            if _is_marker_line(line):  # only under the source line it marks
                assert before.startswith("    "), text
                assert not _is_marker_line(before), text


def test_errors_print_their_public_names(failure_output: tuple[str, str]) -> None:
    for text in failure_output:
        assert "elastrain.executor.WorkerError: Rank 0 worker raised an error" in text, text
        assert "_private.errors" not in text, text


def _is_marker_line(line: str) -> bool:
    return bool(line.strip()) and set(line.strip()) <= set("^~")


@pytest.mark.parametrize("module_name", ["elastrain.executor", "elastrain.executor.elastic"])
def test_public_exceptions_print_their_public_names(module_name: str) -> None:
    assert_exceptions_named_publicly(module_name)


def test_worker_error_survives_pickling() -> None:
    """Ray pickles an exception a task raises (a Tune trial running an executor, say)."""
    error = WorkerError(1, "node-a", "Traceback ...\nValueError: x", ValueError("x"), pid=42)
    error.add_note("a note")
    copy = pickle.loads(pickle.dumps(error))  # noqa: S301 - our own bytes
    assert (copy.rank, copy.node_id, copy.pid, str(copy)) == (1, "node-a", 42, str(error))
    assert isinstance(copy.cause, ValueError)
    assert copy.__notes__ == ["a note"]
    died = pickle.loads(pickle.dumps(WorkerDiedError(0, "node-b", "killed")))  # noqa: S301
    assert (died.rank, died.node_id, died.reason) == (0, "node-b", "killed")
    for skip_sync in (False, True):
        interrupt = pickle.loads(pickle.dumps(elastic.HostsUpdatedInterrupt(skip_sync)))  # noqa: S301
        assert interrupt.skip_sync is skip_sync


RAY_FORMATTED = textwrap.dedent(
    """\
    \x1b[36mray::Worker.run()\x1b[39m (pid=123, ip=10.0.0.7, actor_id=ab, repr=<Worker object at 0x7f>)
               ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
      File "/site-packages/ray/_private/function_manager.py", line 689, in actor_method_executor
        return method(__ray_actor, *args, **kwargs)
               ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
      File "/src/elastrain/executor/_private/worker.py", line 118, in run
        return fn(*args, **kwargs)
               ^^^^^^^^^^^^^^^^^^^
      File "/home/me/train.py", line 7, in train
        value = table[key] + 1
                ~~~~~^^^^^
    KeyError: 'k'"""
)


def test_clean_traceback_keeps_the_users_frames_as_python_prints_them() -> None:
    remote = clean_traceback(RAY_FORMATTED)
    assert remote.text == textwrap.dedent(
        """\
        Traceback (most recent call last):
          File "/home/me/train.py", line 7, in train
            value = table[key] + 1
                    ~~~~~^^^^^
        KeyError: 'k'"""
    )
    assert (remote.pid, remote.ip) == (123, "10.0.0.7")


def test_clean_traceback_leaves_a_plain_traceback_alone() -> None:
    plain = 'Traceback (most recent call last):\n  File "/a.py", line 1, in f\n    g()\nValueError: v'
    assert clean_traceback(plain).text == plain
    assert clean_traceback(plain).pid is None


def test_tracebacks_module_is_importable_without_ray() -> None:
    code = "import sys, elastrain.executor._private.errors; print('ray' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout == "False\n"
