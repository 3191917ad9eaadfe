"""A frozen worker: one of two workers stops answering (SIGSTOP) at step 30; how long until the others step again?

A frozen process looks like a lost node or a cut network: it neither exits nor closes its sockets, so the
survivor's collective with it can only end at a timeout or when someone else notices. The worker records
``time.time()`` and its pid in a marker file, then ``os.kill(os.getpid(), signal.SIGSTOP)``. Measured: from
that moment to the first step *begun* after it on any other worker (a step that had already passed its
collective can finish a few ms after the freeze, which is not recovery).

- elastrain (``measure_elastrain``): two workers (``min_workers=1, max_workers=2``) train a Linear(64, 64)
  with SGD in ``TorchState``, gradients averaged with ``all_reduce``, a 50 ms sleep per step standing in for
  compute and a commit every step (as ``replacement.py``). The executor's liveness check evicts the frozen
  worker after ``liveness_timeout_s`` (default 8 s) and the survivor goes on; run with default settings and
  with ``liveness_timeout_s=5.0`` (torchft's 5 s process-group timeout).
- Ray Train V2 (``measure_ray_train``): ``TorchTrainer`` with 2 CPU workers and ``FailureConfig``, the same
  model and step, a checkpoint reported every 10 steps (so the last is at the freeze). Its controller marks a
  worker dead once a health-check poll has hung for ``RAY_TRAIN_WORKER_HEALTH_CHECK_TIMEOUT_S`` (default
  600 s), then restarts the whole group from the last checkpoint; until then the survivor blocks in its
  allreduce (gloo, ``TorchConfig.timeout_s`` = 1800 s). Run with the default and with a 5 s health check.

Both are bounded: if no step on the others comes within ``bound_s`` of the freeze, the frozen process is
SIGKILLed (which a survivor's collective notices at once) and the run counts as not recovered. A process still
stopped at the end is SIGKILLed too.
"""

from __future__ import annotations

import os
import signal
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

FREEZE_STEP = 30
STEP_S = 0.05
HIDDEN = 64
# Steps after the freeze step: enough for the survivor to go on and the replacement to join, and no more.
STEPS_AFTER = 80
RAY_TRAIN_STEPS_AFTER = 10
# A V2 report takes ~2 s here (drained every health-check interval): reporting every step, as bench.py's crash
# scenario does, would spend a minute reaching the freeze. The last checkpoint is the freeze step's either way.
RAY_TRAIN_CHECKPOINT_EVERY = 10
POLL_S = 0.05
HEALTH_CHECK_TIMEOUT_ENV = "RAY_TRAIN_WORKER_HEALTH_CHECK_TIMEOUT_S"


# -- shared ------------------------------------------------------------------------------------------------------


def freeze_self(marker: str) -> None:
    """Record when and which process froze (atomically, the watcher polls the file), then stop this process."""
    partial = f"{marker}.partial"
    Path(partial).write_text(f"{time.time()} {os.getpid()}")
    os.replace(partial, marker)
    os.kill(os.getpid(), signal.SIGSTOP)


def read_marker(marker: str) -> tuple[float, int] | None:
    if not os.path.exists(marker):
        return None
    at, pid = Path(marker).read_text().split()
    return float(at), int(pid)


def kill_if_stopped(pid: int) -> bool:
    """SIGKILL ``pid`` if it is still a stopped process (a pid reused by another process is left alone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    state = stat.rsplit(")", 1)[1].split()[0]  # the field after "(comm)", which may itself hold spaces
    if state not in ("T", "t"):
        return False
    os.kill(pid, signal.SIGKILL)
    return True


class _Watch(threading.Thread):
    """Waits for the freeze, then for ``recovered()``; SIGKILLs the frozen process at ``bound_s`` if still needed.

    ``done`` can end the watch early (the job ended). Whatever happens, ``finish()`` SIGKILLs the frozen process
    if it is still stopped.
    """

    def __init__(self, marker: str, recovered: Any, bound_s: float) -> None:
        super().__init__(daemon=True)
        self.marker, self.recovered, self.bound_s = marker, recovered, bound_s
        self.frozen: tuple[float, int] | None = None
        self.killed_at: float | None = None
        self.done = threading.Event()

    def run(self) -> None:
        while self.frozen is None and not self.done.wait(POLL_S):
            self.frozen = read_marker(self.marker)
        if self.frozen is None:
            return
        frozen_at, pid = self.frozen
        while not self.recovered(frozen_at, pid) and not self.done.wait(POLL_S):
            if time.time() > frozen_at + self.bound_s:
                if kill_if_stopped(pid):
                    self.killed_at = time.time()
                return

    def finish(self) -> None:
        self.done.set()
        self.join(10)
        self.frozen = self.frozen or read_marker(self.marker)
        if self.frozen and kill_if_stopped(self.frozen[1]) and self.killed_at is None:
            self.killed_at = time.time()


def _outcome(first_step_at: float | None, watch: _Watch) -> dict[str, Any]:
    """``recovery_s``: freeze → the first step on the others; ``bound_s`` (a lower bound) where none came in time."""
    if watch.frozen is None:
        raise RuntimeError("the worker never froze")
    frozen_at = watch.frozen[0]
    in_time = first_step_at is not None and (watch.killed_at is None or first_step_at < watch.killed_at)
    if first_step_at is None and watch.killed_at is None:
        raise RuntimeError("no step on the other workers after the freeze, and the job ended")
    return {
        "recovery_s": first_step_at - frozen_at if in_time and first_step_at is not None else watch.bound_s,
        "recovered": in_time,
        "bound_s": watch.bound_s,
    }


# -- elastrain ---------------------------------------------------------------------------------------------------


def train(steps: int, marker: str) -> int:
    import torch
    import torch.distributed as dist

    from elastrain.executor import context, elastic, init_process_group, send

    init_process_group()
    torch.manual_seed(0)
    model = torch.nn.Linear(HIDDEN, HIDDEN)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    state = elastic.TorchState(model, optimizer, step=0)

    @elastic.run
    def loop(state: elastic.TorchState) -> int:
        while state.step < steps:
            begun = time.time()
            if dist.get_rank() == 1 and state.step == FREEZE_STEP and not os.path.exists(marker):
                freeze_self(marker)
            optimizer.zero_grad()
            time.sleep(STEP_S)  # compute stands in before the step's gradient allreduce
            model(torch.randn(8, HIDDEN)).pow(2).mean().backward()
            for parameter in model.parameters():
                dist.all_reduce(parameter.grad)
                parameter.grad /= dist.get_world_size()
            optimizer.step()
            state.step += 1
            send(
                {
                    "t": time.time(),
                    "begun": begun,
                    "size": dist.get_world_size(),
                    "step": state.step,
                    "worker": context().run_id,
                    "pid": os.getpid(),
                }
            )
            state.commit()
        return os.getpid()

    return int(loop(state))


def measure_elastrain(liveness_timeout_s: float | None = None, bound_s: float = 30.0) -> dict[str, Any]:
    """Freeze → the survivor's next step, with the executor's default liveness timeout (None) or the one given."""
    import ray

    from elastrain.executor import RayExecutor

    steps: list[dict[str, Any]] = []

    def after(frozen_at: float, pid: int) -> list[dict[str, Any]]:
        return [m for m in list(steps) if m["begun"] > frozen_at and m["pid"] != pid]

    # address="local": a fresh Ray even where another cluster runs on this machine (ray.init would join it).
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            marker = os.path.join(tmp, "frozen")
            watch = _Watch(marker, lambda at, pid: bool(after(at, pid)), bound_s)
            watch.start()
            extra: dict[str, Any] = {} if liveness_timeout_s is None else {"liveness_timeout_s": liveness_timeout_s}
            settings = RayExecutor.create_settings(timeout_s=60, **extra)
            try:
                with RayExecutor(settings, min_workers=1, max_workers=2, cpus_per_worker=1) as executor:
                    executor.start()
                    executor.run(train, args=[FREEZE_STEP + STEPS_AFTER, marker], callbacks=[steps.append])
            finally:
                watch.finish()
    finally:
        ray.shutdown()
    assert watch.frozen is not None, "the worker never froze"
    later = after(*watch.frozen)
    result = _outcome(later[0]["t"] if later else None, watch)
    full = [m for m in later if m["size"] == 2]
    if full:  # the replacement's first step in a group of two again
        result["back_to_full_s"] = full[0]["t"] - watch.frozen[0]
    result["liveness_timeout_s"] = "default" if liveness_timeout_s is None else liveness_timeout_s
    return result


# -- Ray Train V2 ------------------------------------------------------------------------------------------------


def _ray_train_loop(config: dict[str, Any]) -> None:
    import ray.train
    import torch
    import torch.distributed as dist
    from ray.train import Checkpoint

    start = 0
    checkpoint = ray.train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as directory:
            start = int(Path(directory, "step").read_text())
    rank = ray.train.get_context().get_world_rank()
    torch.manual_seed(0)
    model = torch.nn.Linear(HIDDEN, HIDDEN)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(start, FREEZE_STEP + RAY_TRAIN_STEPS_AFTER):
        if os.path.exists(config["stop"]):
            return
        begun = time.time()
        if step == FREEZE_STEP and rank == 1 and not os.path.exists(config["marker"]):
            freeze_self(config["marker"])
        optimizer.zero_grad()
        time.sleep(STEP_S)
        model(torch.randn(8, HIDDEN)).pow(2).mean().backward()
        for parameter in model.parameters():
            dist.all_reduce(parameter.grad)
            parameter.grad /= dist.get_world_size()
        optimizer.step()
        with open(config["log"], "a") as out:
            out.write(f"{time.time()} {begun} {os.getpid()}\n")
        if (step + 1) % RAY_TRAIN_CHECKPOINT_EVERY == 0:
            with tempfile.TemporaryDirectory() as directory:
                Path(directory, "step").write_text(str(step + 1))
                ray.train.report({"step": step}, checkpoint=Checkpoint.from_directory(directory))


def measure_ray_train(health_check_timeout_s: float | None = None, bound_s: float = 90.0) -> dict[str, Any]:
    """Freeze → the next step of any worker group, with Ray Train V2's default health check (None) or the one given."""
    if health_check_timeout_s is not None:  # read by the controller; the driver's environment is propagated
        os.environ[HEALTH_CHECK_TIMEOUT_ENV] = str(health_check_timeout_s)
    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer
    from ray.train.v2._internal.constants import is_v2_enabled

    def entries(log: str) -> list[tuple[float, float, int]]:
        if not os.path.exists(log):
            return []
        lines = Path(log).read_text().split("\n")[:-1]  # whole lines only
        return [(float(t), float(begun), int(pid)) for t, begun, pid in (line.split() for line in lines)]

    # address="local": a fresh Ray even where another cluster runs on this machine (ray.init would join it).
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    fit_outcome: dict[str, str] = {}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            marker, log, stop = (os.path.join(tmp, name) for name in ("frozen", "steps", "stop"))

            def after(frozen_at: float, pid: int) -> list[tuple[float, float, int]]:
                return [e for e in entries(log) if e[1] > frozen_at and e[2] != pid]

            trainer = TorchTrainer(
                _ray_train_loop,
                train_loop_config={"marker": marker, "log": log, "stop": stop},
                scaling_config=ScalingConfig(num_workers=2),
                run_config=RunConfig(storage_path=tmp, failure_config=FailureConfig(max_failures=2)),
            )

            def fit() -> None:
                try:
                    trainer.fit()
                    fit_outcome["fit"] = "returned"
                except Exception as error:  # reported, not raised: what Ray Train did is the result
                    fit_outcome["fit"] = f"{type(error).__name__}: {str(error).strip()[:300]}"

            watch = _Watch(marker, lambda at, pid: bool(after(at, pid)), bound_s)
            watch.start()
            fitting = threading.Thread(target=fit, daemon=True)
            fitting.start()
            try:
                deadline = time.time() + 300
                while watch.is_alive() and fitting.is_alive() and time.time() < deadline:
                    time.sleep(POLL_S)
            finally:
                Path(stop).write_text("")  # whatever runs next returns at once
                watch.finish()
                fitting.join(60)
            if watch.frozen is None:
                raise RuntimeError(f"the worker never froze; fit: {fit_outcome.get('fit', 'still running')}")
            frozen_at, pid = watch.frozen
            before = {p for _, begun, p in entries(log) if begun < frozen_at}
            later = after(frozen_at, pid)
    finally:
        ray.shutdown()
    result = _outcome(later[0][0] if later else None, watch)
    result.update(
        {
            # A step from a process that ran before the freeze: the survivor went on; otherwise a new group.
            "next_step_by": "none" if not later else "survivor" if later[0][2] in before else "restarted group",
            "survivor_steps_before_bound": sum(1 for _, begun, p in later if p in before),
            "fit": fit_outcome.get("fit", "still running after the frozen worker was killed"),
            "health_check_timeout_s": "default (600 s)" if health_check_timeout_s is None else health_check_timeout_s,
            "v2_enabled": is_v2_enabled(),
        }
    )
    return result


if __name__ == "__main__":
    import json
    import sys

    # python freeze.py elastrain [LIVENESS_S] | ray_train [HEALTH_CHECK_S] [BOUND_S]
    which = sys.argv[1] if len(sys.argv) > 1 else "elastrain"
    value = float(sys.argv[2]) if len(sys.argv) > 2 and sys.argv[2] != "default" else None
    if which == "ray_train":
        bound = float(sys.argv[3]) if len(sys.argv) > 3 else 90.0
        print(json.dumps(measure_ray_train(value, bound_s=bound), indent=2))
    else:
        print(json.dumps(measure_elastrain(value), indent=2))
