"""torchft 0.2.0 as a baseline for elastic recovery: CPU, gloo, 3 single-process replica groups on one machine.

A lighthouse (``torchft._torchft.LighthouseServer``, ``min_replicas=2``, join timeout 1 s, heartbeat defaults)
runs in its own process on 127.0.0.1. Each replica group is one process (group world size 1) training a
Linear(64, 64) with torchft's ``Manager`` (``ProcessGroupGloo`` with a 5 s timeout, ``min_replica_size=2``,
every other setting torchft's default) and ``OptimizerWrapper`` around SGD; gradients go through
``manager.allreduce``. A 50 ms sleep between a step's quorum and its allreduce stands in for compute. Each
replica prints ``time.time()`` for every committed step (and when that step began) to its stdout file, which
the parent polls: the timestamps are the replicas' own, so polling adds nothing to them.

- crash → survivors' next commit: once every replica commits steadily, one replica is SIGKILLed; on each
  survivor, the time from the kill to the first commit of a step begun after the kill (a step that had already
  allreduced with the victim can still commit a few ms after the kill, which is not recovery). The value is
  the MAX over the two survivors: training is back only once both commit (per-survivor values are kept too).
- restart → first commit: the killed replica is launched again (a fresh process, as a supervisor would); the
  time from just before ``Popen`` to its first commit, which includes importing torch and torchft, joining the
  quorum, configuring gloo and healing (fetching the model and optimizer state from a peer).

Both run ``repeats`` times in one job (one lighthouse), killing replica 0, 1, 2, 0, ... in turn; kills are more
than the lighthouse's heartbeat timeout apart, so a previous victim never counts as a live replica. With
``with_ddp_check`` a second job wraps the model in ``torchft.ddp.DistributedDataParallel`` instead and kills
(and relaunches) a replica up to ``DDP_KILLS`` times, stopping at the first survivor that exits with an error:
when a survivor's allreduce fails because its peer died, DDP's comm hook in torchft 0.2.0 asserts.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

TORCHFT_VERSION = "0.2.0"
REPLICAS = 3
MIN_REPLICAS = 2
JOIN_TIMEOUT_MS = 1000
PG_TIMEOUT_S = 5
HIDDEN = 64
# Stands in for a step's compute (elastrain's bench uses the same); it also leaves CPU for a restart on 2 cores.
STEP_S = 0.05
# The lighthouse's default heartbeat timeout: until it passes, a killed replica still counts as healthy, and a
# quorum needs more than half of the healthy replicas. Kills are spaced by more than this so that each repeat
# starts clean rather than waiting on the previous victim.
HEARTBEAT_TIMEOUT_S = 5.0
# Commits every replica makes after a (re)start before the next kill: the job is steady by then.
STEADY_COMMITS = 10
# How long a DDP survivor gets to either commit again or die after the kill; recovery takes ~1 s otherwise.
DDP_WATCH_S = 20.0
# Kills at most (each followed by a relaunch) in the DDP check, which ends at the first crash: whether a
# survivor crashes depends on whether the kill lands while the survivors' allreduce includes the victim.
DDP_KILLS = 3
POLL_S = 0.01
INSTALL_HINT = f"torchft is not installed (pip install torchft=={TORCHFT_VERSION})"


# -- child processes -------------------------------------------------------------------------------------------


def _lighthouse_main() -> None:
    from torchft._torchft import LighthouseServer

    parent = os.getppid()
    # Port 0: the OS picks a free port, so concurrent runs never collide.
    server = LighthouseServer(bind="127.0.0.1:0", min_replicas=MIN_REPLICAS, join_timeout_ms=JOIN_TIMEOUT_MS)
    print(f"lighthouse {server.address()}", flush=True)
    try:
        while os.getppid() == parent:  # the parent normally terminates us; this covers its dying first
            time.sleep(0.2)
    finally:
        server.shutdown()


def _replica_main(index: int, lighthouse: str, use_ddp: bool, pg_timeout_s: float | None) -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from torchft import DistributedDataParallel, Manager, ProcessGroupGloo
    from torchft.optim import OptimizerWrapper

    torch.set_num_threads(1)  # 3 replicas share 2 cores
    parent = os.getppid()
    # The group's own store (world size 1, so this process is its master); port 0 picks a free one.
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    torch.manual_seed(0)
    model = torch.nn.Linear(HIDDEN, HIDDEN)
    sgd = torch.optim.SGD(model.parameters(), lr=0.01)

    def load_state(state: dict[str, Any]) -> None:
        model.load_state_dict(state["model"])
        sgd.load_state_dict(state["optim"])

    # None: torchft's own default (ProcessGroupGloo's 60 s in 0.2.0), constructed without the argument.
    pg = ProcessGroupGloo() if pg_timeout_s is None else ProcessGroupGloo(timeout=timedelta(seconds=pg_timeout_s))
    manager = Manager(
        pg=pg,
        load_state_dict=load_state,
        state_dict=lambda: {"model": model.state_dict(), "optim": sgd.state_dict()},
        min_replica_size=MIN_REPLICAS,
        store_addr="127.0.0.1",
        store_port=store.port,
        rank=0,
        world_size=1,
        lighthouse_addr=lighthouse,
        replica_id=f"replica_{index}",
    )
    optimizer = OptimizerWrapper(manager, sgd)
    net: torch.nn.Module = DistributedDataParallel(manager, model) if use_ddp else model
    data = torch.Generator().manual_seed(index)
    print(f"ready {time.time():.6f}", flush=True)
    try:
        while os.getppid() == parent:
            started = time.time()
            inputs = torch.randn(8, HIDDEN, generator=data)
            optimizer.zero_grad()  # starts this step's quorum (async)
            # The step's compute. Here, between the quorum and the allreduce, as in real training, a crash most
            # often lands after the quorum included the victim: the survivors' allreduce then fails.
            time.sleep(STEP_S)
            net(inputs).pow(2).mean().backward()
            if not use_ddp:
                works = [manager.allreduce(p.grad) for p in model.parameters() if p.grad is not None]
                for work in works:
                    work.wait()
            before = manager.current_step()
            optimizer.step()  # steps SGD only where every replica agreed to commit
            if manager.current_step() > before:
                print(f"commit {manager.current_step()} {time.time():.6f} {started:.6f}", flush=True)
    finally:
        manager.shutdown(wait=False)


# -- the parent's side -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Commit:
    step: int
    at: float  # when the replica saw its commit succeed
    step_started: float  # when that step began (zero_grad, which starts its quorum)


@dataclass(eq=False)  # compared by identity
class _Process:
    popen: subprocess.Popen[bytes]
    stdout: Path
    stderr: Path
    launched_at: float
    killed: bool = False

    def lines(self) -> list[str]:
        text = self.stdout.read_text() if self.stdout.exists() else ""
        return text.split("\n")[:-1]  # only whole lines: the last may still be being written

    def ready_at(self) -> float | None:
        return next((float(line.split()[1]) for line in self.lines() if line.startswith("ready ")), None)

    def commits(self) -> list[_Commit]:
        fields = (line.split() for line in self.lines() if line.startswith("commit "))
        return [_Commit(int(step), float(at), float(started)) for _, step, at, started in fields]

    def first_commit_begun_after(self, moment: float) -> _Commit | None:
        """The first commit of a step that began after ``moment``.

        A step that had already allreduced with the killed replica can still commit a few ms after the kill;
        that is not recovery, so only steps begun after the kill count.
        """
        return next((c for c in self.commits() if c.step_started > moment), None)

    def has_committed(self) -> bool:
        return bool(self.commits())

    def error_tail(self, chars: int = 3000) -> str:
        return self.stderr.read_text(errors="replace")[-chars:] if self.stderr.exists() else ""


@dataclass
class _Job:
    """A lighthouse and ``REPLICAS`` replica processes, each writing to its own files under ``workdir``."""

    workdir: Path
    use_ddp: bool
    timeout_s: float
    pg_timeout_s: float | None = PG_TIMEOUT_S  # None: torchft's default
    lighthouse: str = ""
    current: dict[int, _Process] = field(default_factory=dict)
    everything: list[_Process] = field(default_factory=list)

    def _spawn(self, name: str, args: list[str]) -> _Process:
        number = len(self.everything)
        out, err = self.workdir / f"{number}-{name}.out", self.workdir / f"{number}-{name}.err"
        # Inherited TORCHFT_* variables (timeouts, OpenTelemetry) would override the settings measured here.
        env = {key: value for key, value in os.environ.items() if not key.startswith("TORCHFT_")}
        env["OMP_NUM_THREADS"] = "1"
        with out.open("wb") as stdout, err.open("wb") as stderr:
            launched_at = time.time()
            popen = subprocess.Popen(
                [sys.executable, __file__, *args], stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL, env=env
            )
        process = _Process(popen, out, err, launched_at)
        self.everything.append(process)
        return process

    def start(self) -> None:
        lighthouse = self._spawn("lighthouse", ["--lighthouse"])
        self.wait_for(lambda: any(line.startswith("lighthouse ") for line in lighthouse.lines()), "the lighthouse")
        self.lighthouse = next(line.split()[1] for line in lighthouse.lines() if line.startswith("lighthouse "))
        for index in range(REPLICAS):
            self.launch(index)

    def launch(self, index: int) -> _Process:
        pg_timeout = "default" if self.pg_timeout_s is None else str(self.pg_timeout_s)
        args = ["--replica", str(index), self.lighthouse, "ddp" if self.use_ddp else "allreduce", pg_timeout]
        self.current[index] = self._spawn(f"replica{index}", args)
        return self.current[index]

    def kill(self, index: int) -> float:
        process = self.current.pop(index)
        process.killed = True
        killed_at = time.time()
        process.popen.send_signal(signal.SIGKILL)
        process.popen.wait(self.timeout_s)
        return killed_at

    def freeze(self, index: int) -> tuple[_Process, float]:
        """SIGSTOP a replica: it neither exits nor answers (no FIN on its sockets, no lighthouse heartbeats)."""
        process = self.current.pop(index)
        frozen_at = time.time()
        process.popen.send_signal(signal.SIGSTOP)
        return process, frozen_at

    def kill_frozen(self, process: _Process) -> None:
        process.killed = True
        process.popen.send_signal(signal.SIGKILL)  # a stopped process still dies of SIGKILL
        process.popen.wait(self.timeout_s)

    def crashed(self) -> list[_Process]:
        """Processes that exited without our killing them."""
        return [p for p in self.everything if not p.killed and p.popen.poll() is not None]

    def watch(self, done: Callable[[], bool], timeout_s: float) -> bool:
        """Poll ``done``: True once it holds; False at the deadline or as soon as a process exits on its own."""
        deadline = time.monotonic() + timeout_s
        while not done():
            if self.crashed() or time.monotonic() > deadline:
                return False
            time.sleep(POLL_S)
        return True

    def wait_for(self, done: Callable[[], bool], what: str) -> None:
        if self.watch(done, self.timeout_s):
            return
        for process in self.crashed()[:1]:
            raise RuntimeError(
                f"{process.stdout.stem} exited ({process.popen.returncode}) while waiting for {what}:\n"
                f"{process.error_tail()}"
            )
        raise TimeoutError(f"waited {self.timeout_s:g} s for {what}")

    def steady(self) -> bool:
        return all(len(p.commits()) >= STEADY_COMMITS for p in self.current.values())

    def ready_to_kill(self, last_kill: float) -> bool:
        return self.steady() and time.time() > last_kill + HEARTBEAT_TIMEOUT_S + 0.5

    def stop(self) -> None:
        for process in self.everything:
            if process.popen.poll() is None:
                process.popen.terminate()
                process.popen.send_signal(signal.SIGCONT)  # a frozen one acts on SIGTERM only once resumed
        for process in self.everything:
            try:
                process.popen.wait(5)
            except subprocess.TimeoutExpired:
                process.popen.kill()
                process.popen.wait(5)


def _all_committed_after(processes: list[_Process], moment: float) -> bool:
    return all(p.first_commit_begun_after(moment) for p in processes)


def _median(values: list[float]) -> dict[str, Any]:
    return {"median": round(statistics.median(values), 3), "values": [round(v, 3) for v in values]}


def _recovery_rounds(job: _Job, repeats: int) -> dict[str, Any]:
    crash: list[float] = []
    per_survivor: list[list[float]] = []
    restart: list[float] = []
    launch_to_ready: list[float] = []
    first_steps: list[int] = []
    job.start()
    killed_at = 0.0
    for repeat in range(repeats):
        job.wait_for(partial(job.ready_to_kill, killed_at), f"every replica to commit {STEADY_COMMITS} steps")
        victim = repeat % REPLICAS
        survivors = [job.current[i] for i in sorted(job.current) if i != victim]
        killed_at = job.kill(victim)
        job.wait_for(partial(_all_committed_after, survivors, killed_at), "the survivors' next commit")
        times = [c.at - killed_at for p in survivors if (c := p.first_commit_begun_after(killed_at))]
        per_survivor.append([round(t, 3) for t in times])
        crash.append(max(times))
        replacement = job.launch(victim)
        job.wait_for(replacement.has_committed, "the restarted replica's first commit")
        first = replacement.commits()[0]
        restart.append(first.at - replacement.launched_at)
        launch_to_ready.append((replacement.ready_at() or first.at) - replacement.launched_at)
        first_steps.append(first.step)
    return {
        "crash_to_next_commit_s": {**_median(crash), "per_survivor": per_survivor},
        "restart_to_first_commit_s": {
            **_median(restart),
            # Python, torch and torchft imports, the group's store and the Manager (which registers with the
            # lighthouse); the rest is joining the quorum, configuring gloo and healing from a peer.
            "launch_to_manager_ready": _median(launch_to_ready),
            # The peers' step + 1 rather than 1: the replica took its state from a peer before committing.
            "first_committed_step": first_steps,
        },
        "killed_replicas": [repeat % REPLICAS for repeat in range(repeats)],
    }


def _error_line(process: _Process) -> str:
    """The last error line of a process's stderr, with the frame that raised it (a bare assert says little)."""
    lines = [line.strip() for line in process.error_tail(20000).splitlines() if line.strip()]
    errors = [i for i, line in enumerate(lines) if "Error" in line or "assert" in line]
    if not errors:
        return lines[-1] if lines else ""
    last = errors[-1]
    frames = [(i, found) for i in range(last) if (found := re.match(r'File "(.*)", line (\d+), in (.*)', lines[i]))]
    if not frames:
        return lines[last]
    index, found = frames[-1]
    path, line, function = found.groups()
    path = path.split("site-packages/")[-1]  # torchft/ddp.py rather than the venv's absolute path
    code = lines[index + 1] if index + 1 < last else ""
    return f"{lines[last]} at {path}:{line} in {function}: {code}".rstrip(": ")


def _ddp_check(job: _Job) -> dict[str, Any]:
    """Kill and relaunch replicas of a DDP-wrapped job ``DDP_KILLS`` times; does any survivor die?"""
    watch_s = min(DDP_WATCH_S, job.timeout_s)
    job.start()
    job.wait_for(job.steady, f"every DDP replica to commit {STEADY_COMMITS} steps")
    recovered = True
    survivors: list[_Process] = []
    killed_at = 0.0
    for kill in range(DDP_KILLS):
        if not job.watch(partial(job.ready_to_kill, killed_at), job.timeout_s):
            recovered = False
            break
        victim = kill % REPLICAS
        survivors = [job.current[i] for i in sorted(job.current) if i != victim]
        killed_at = job.kill(victim)
        if not job.watch(partial(_all_committed_after, survivors, killed_at), watch_s):
            recovered = False
            break
        replacement = job.launch(victim)
        if not job.watch(replacement.has_committed, watch_s):
            recovered = False
            break
    if not recovered and not job.crashed():
        # A survivor may still be printing its traceback: give it a moment to exit before looking.
        job.watch(lambda: bool(job.crashed()), 2.0)
    dead = job.crashed()
    survivor_dead = [p for p in dead if p in survivors]
    error = None
    if dead:
        process = (survivor_dead or dead)[0]
        error = f"{process.stdout.stem} exited with {process.popen.returncode}: {_error_line(process)}"
    return {
        "ddp_survivor_crashed": bool(survivor_dead),
        "ddp_error": error,
        "ddp_recovered_every_time": recovered,
        "ddp_kills": DDP_KILLS,
    }


def measure_torchft(repeats: int = 3, timeout_s: float = 120.0, with_ddp_check: bool = True) -> dict[str, Any]:
    """Measure torchft's recovery (see the module docstring); ``timeout_s`` bounds each wait, not the whole call.

    Returns medians and raw values of ``crash_to_next_commit_s`` (max over the survivors) and
    ``restart_to_first_commit_s``, the DDP check's outcome, and the settings; ``{"skipped": ...}`` when torchft
    is not installed. Every process started here is stopped before it returns or raises.
    """
    # Looked up, not imported: importing torchft imports torch, which only the children need.
    if importlib.util.find_spec("torchft") is None:
        return {"skipped": INSTALL_HINT}
    version = importlib.metadata.version("torchft")
    result: dict[str, Any] = {"torchft_version": version}
    with tempfile.TemporaryDirectory(prefix="torchft-baseline-") as tmp:
        job = _Job(Path(tmp, "allreduce"), use_ddp=False, timeout_s=timeout_s)
        job.workdir.mkdir()
        started = time.monotonic()
        try:
            result.update(_recovery_rounds(job, repeats))
        finally:
            job.stop()
        result["recovery_rounds_s"] = round(time.monotonic() - started, 1)
        if with_ddp_check:
            job = _Job(Path(tmp, "ddp"), use_ddp=True, timeout_s=timeout_s)
            job.workdir.mkdir()
            started = time.monotonic()
            try:
                result.update(_ddp_check(job))
            finally:
                job.stop()
            result["ddp_check_s"] = round(time.monotonic() - started, 1)
    result["settings"] = {
        "replica_groups": REPLICAS,
        "processes_per_group": 1,
        "backend": "gloo (torchft.ProcessGroupGloo), CPU",
        "lighthouse": {"min_replicas": MIN_REPLICAS, "join_timeout_ms": JOIN_TIMEOUT_MS, "heartbeat": "defaults"},
        "manager": {"min_replica_size": MIN_REPLICAS, "pg_timeout_s": PG_TIMEOUT_S, "other": "torchft defaults"},
        "model": f"Linear({HIDDEN}, {HIDDEN}), SGD via OptimizerWrapper, manager.allreduce per gradient",
        "step_sleep_s": STEP_S,
        "steady_commits_before_kill": STEADY_COMMITS,
        "repeats": repeats,
        "crash_to_next_commit": "max over the survivors, of the first commit of a step begun after the kill",
        "kills_apart_s": f"> {HEARTBEAT_TIMEOUT_S + 0.5:g} (the lighthouse's heartbeat timeout + 0.5)",
        "ddp_check": f"torchft.ddp.DistributedDataParallel; up to {DDP_KILLS} kills, each followed by a relaunch, "
        "until a survivor exits",
    }
    return result


def _freeze_rounds(job: _Job, repeats: int, bound_s: float) -> dict[str, Any]:
    """Freeze (SIGSTOP) a replica ``repeats`` times; each time, wait at most ``bound_s`` for the survivors.

    After each round the frozen replica is SIGKILLed and relaunched (as a supervisor would once it noticed),
    and the job gets steady again before the next freeze.
    """
    recovery: list[float] = []
    per_survivor: list[list[float]] = []
    unrecovered = 0
    job.start()
    last_event = 0.0
    for repeat in range(repeats):
        job.wait_for(partial(job.ready_to_kill, last_event), f"every replica to commit {STEADY_COMMITS} steps")
        victim = repeat % REPLICAS
        survivors = [job.current[i] for i in sorted(job.current) if i != victim]
        frozen, frozen_at = job.freeze(victim)
        try:
            recovered = job.watch(partial(_all_committed_after, survivors, frozen_at), bound_s)
            if not recovered and job.crashed():
                job.wait_for(lambda: False, "the survivors' next commit")  # raises with the crashed one's error
        finally:
            job.kill_frozen(frozen)
        last_event = time.time()
        if recovered:
            times = [c.at - frozen_at for p in survivors if (c := p.first_commit_begun_after(frozen_at))]
            per_survivor.append([round(t, 3) for t in times])
            recovery.append(max(times))
        else:
            unrecovered += 1
            per_survivor.append([])
        job.wait_for(job.launch(victim).has_committed, "the relaunched replica's first commit")
    result: dict[str, Any] = {"per_survivor": per_survivor, "unrecovered": unrecovered, "bound_s": bound_s}
    if recovery:
        result.update(_median(recovery))
    return {"freeze_to_next_commit_s": result, "frozen_replicas": [r % REPLICAS for r in range(repeats)]}


def measure_torchft_freeze(
    repeats: int = 3, pg_timeout_s: float | None = PG_TIMEOUT_S, bound_s: float = 30.0, timeout_s: float = 120.0
) -> dict[str, Any]:
    """Freeze → survivors' next commit: once steady, one replica is SIGSTOPped instead of killed.

    The survivors' allreduce with the frozen replica can only end at the process group's timeout
    (``pg_timeout_s``; None: torchft's default, 60 s in 0.2.0), and the lighthouse drops the frozen replica
    once its heartbeats stop for 5 s. Measured like a crash: from the freeze to the first commit of a step
    begun after it, max over the survivors; a round with no such commit within ``bound_s`` counts as
    unrecovered (``> bound_s``). Every process started here is SIGKILLed or stopped before it returns.
    """
    if importlib.util.find_spec("torchft") is None:
        return {"skipped": INSTALL_HINT}
    result: dict[str, Any] = {"torchft_version": importlib.metadata.version("torchft")}
    with tempfile.TemporaryDirectory(prefix="torchft-freeze-") as tmp:
        job = _Job(Path(tmp), use_ddp=False, timeout_s=timeout_s, pg_timeout_s=pg_timeout_s)
        started = time.monotonic()
        try:
            result.update(_freeze_rounds(job, repeats, bound_s))
        finally:
            job.stop()
        result["freeze_rounds_s"] = round(time.monotonic() - started, 1)
    result["settings"] = {
        "replica_groups": REPLICAS,
        "lighthouse": {"min_replicas": MIN_REPLICAS, "join_timeout_ms": JOIN_TIMEOUT_MS, "heartbeat": "defaults"},
        "pg_timeout_s": "torchft default (60 s)" if pg_timeout_s is None else pg_timeout_s,
        "manager_timeout_s": "torchft default (60 s)",
        "step_sleep_s": STEP_S,
        "repeats": repeats,
        "freeze_to_next_commit": "max over the survivors, of the first commit of a step begun after the SIGSTOP",
    }
    return result


def main() -> None:
    if sys.argv[1:2] == ["--lighthouse"]:
        _lighthouse_main()
    elif sys.argv[1:2] == ["--replica"]:
        pg_timeout = None if sys.argv[5] == "default" else float(sys.argv[5])
        _replica_main(int(sys.argv[2]), sys.argv[3], sys.argv[4] == "ddp", pg_timeout)
    elif sys.argv[1:2] == ["--freeze"]:
        # --freeze [PG_TIMEOUT_S|default] [REPEATS]
        pg_timeout = PG_TIMEOUT_S if len(sys.argv) < 3 else None if sys.argv[2] == "default" else float(sys.argv[2])
        repeats = int(sys.argv[3]) if len(sys.argv) > 3 else 3
        print(json.dumps(measure_torchft_freeze(repeats, pg_timeout_s=pg_timeout), indent=2), flush=True)
    else:
        print(json.dumps(measure_torchft(), indent=2), flush=True)


if __name__ == "__main__":
    main()
