"""Scale by simulation: the control plane of an elastic job at 8 to 1,024 workers, and its pure core at 10,000.

Same run, one local Ray on this machine:
- the scale harness (``harness.py``): the real driver, rendezvous and message actors with N simulated workers
  (``simulated.py``, 128 to a process) on N / 4 simulated hosts, through start, steady state, one failure and its
  replacement, 10 hosts added, and ``send()`` at 10 messages a second per worker; N = 8, 64, 256, 1,024;
- the driver's pure core (``core_scale.py``) at N = 8 ... 10,000, in-process: CPU per ``step`` and memory;
- the sync's transfer (``broadcast.py``): a 100M-parameter state with Adam broadcast over 2, 4 and 8 real CPU
  processes (gloo), the constants of docs/scale.md's model.

Every curve is printed against N and drawn log-log in the report. Targets (#28): one failure → new group
published ≤ 1 s at 1,024; every control-plane curve ≤ 5× from 256 to 1,024; the rendezvous actor under one core
at 1,024 in steady state; the core's memory linear; the core's step ≤ 100 ms of CPU at 10,000 on one failure.
"""

from __future__ import annotations

import logging
import os
import statistics
from pathlib import Path
from typing import Any

from broadcast import broadcast_seconds
from core_scale import core_costs, core_memory_bytes
from harness import SEND_HZ, run_job

from benchlib import Row, parse_args, write_results

CORE_REPEATS = 3
# The harness's curves: (name in the report, key in run_job's result).
CURVES = [
    ("start → every worker in the first group", "start_to_first_group_s"),
    ("one failure → new group published", "failure_to_published_s"),
    ("one failure → every survivor's next step", "failure_to_survivors_step_s"),
    ("replacement started → its first step in the group", "replacement_join_s"),
    ("10 hosts added → all 40 newcomers stepping", "ten_hosts_added_to_step_s"),
]
# CPU the rendezvous actor spends on an event: what grows with N wherever the workers run (on this machine's 2
# cores the wall-clock curves above also carry every simulated worker's own CPU).
CPU_CURVES = [
    ("rendezvous actor CPU: start → every worker in the first group", "start_coordinator_cpu_s"),
    ("rendezvous actor CPU: one failure → every survivor's next step", "failure_coordinator_cpu_s"),
]
CORE_FAILURE = "one failure: death to new group"


def main() -> None:
    import ray

    args = parse_args(__doc__ or "")
    logging.getLogger("elastrain").setLevel(logging.ERROR)  # a job of 1,024 logs every start and loss
    sizes = (8, 64) if args.quick else (8, 64, 256, 1024)
    core_sizes = (8, 64, 1024) if args.quick else (8, 64, 256, 1024, 10_000)

    core: dict[int, dict[str, float]] = {}
    for n in core_sizes:
        runs = [core_costs(n) for _ in range(CORE_REPEATS)]
        core[n] = {case: statistics.median(run[case] for run in runs) for case in runs[0]}
    memory = {n: core_memory_bytes(n) for n in core_sizes}

    # The simulated workers' processes import simulated.py from here.
    here = str(Path(__file__).resolve().parent)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH", "")) if p)
    # The sync's transfer, with nothing else running: 8 processes of 1.2 GB each.
    broadcast = {n: broadcast_seconds(n) for n in ((2, 4) if args.quick else (2, 4, 8))}

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    jobs: dict[int, dict[str, Any]] = {}
    failed: dict[str, str] = {}
    try:
        for n in sizes:
            try:
                jobs[n] = run_job(n, window_s=3.0 if args.quick else 6.0)
            except Exception as error:  # the machine could not drive this many: say so, keep the sizes that ran
                failed[str(n)] = f"{type(error).__name__}: {error}"
                print(f"N={n} did not complete: {failed[str(n)]}", flush=True)
                break
            print(
                f"N={n}: " + ", ".join(f"{k}={v:.3f}" for k, v in jobs[n].items() if isinstance(v, float)), flush=True
            )
    finally:
        ray.shutdown()

    sizes = tuple(jobs)
    top, mid = sizes[-1], sizes[-2]
    big = core_sizes[-1]
    rows = [
        Row("one failure → new group published", f"{top:,} simulated workers", jobs[top]["failure_to_published_s"],
            f"the same at {sizes[0]}", jobs[sizes[0]]["failure_to_published_s"], None, target_s=1.0),
    ]  # fmt: skip
    for name, key in CURVES:
        rows.append(Row(f"growth: {name}", f"{top:,} workers", jobs[top][key], f"at {mid:,}", jobs[mid][key], 5.0))
    for name, key in CPU_CURVES:
        rows.append(Row(f"growth: {name}", f"{top:,} workers", jobs[top][key], f"at {mid:,}", jobs[mid][key], 5.0))
    rows.append(
        Row("machine busy from one failure to every survivor's next step", f"{top:,} workers",
            jobs[top]["failure_machine_busy"], "cores on this machine", float(os.cpu_count() or 1), None,
            unit="cores")
    )  # fmt: skip
    rows += [
        Row("growth: coordinator CPU, steady state", f"{top:,} workers", jobs[top]["steady"]["coordinator_cpu"],
            f"at {mid:,}", jobs[mid]["steady"]["coordinator_cpu"], 5.0, target_s=1.0, unit="cores"),
        Row("growth: driver loop CPU per iteration", f"{top:,} workers", jobs[top]["driver_iteration_cpu_s"],
            f"at {mid:,}", jobs[mid]["driver_iteration_cpu_s"], 5.0),
        Row("send() delivered, 10 messages/s per worker", f"{top:,} + 40 workers",
            jobs[top]["sending"]["delivered_per_s"],
            f"offered ({jobs[top]['sending_workers']:,} × {SEND_HZ:g}/s)", jobs[top]["sending_workers"] * SEND_HZ,
            None, unit="/s"),
        Row("pure core, one failure: CPU of the step", f"{big:,} workers", core[big][CORE_FAILURE],
            f"at {core_sizes[-2]:,}", core[core_sizes[-2]][CORE_FAILURE], None, target_s=0.1),
        Row("pure core memory per worker", f"{big:,} workers", memory[big] / big, f"at {core_sizes[-2]:,}",
            memory[core_sizes[-2]] / core_sizes[-2], 1.5, unit="B"),
    ]  # fmt: skip

    curves = {name: {str(n): round(jobs[n][key], 4) for n in sizes} for name, key in CURVES}
    curves.update({name: {str(n): round(jobs[n][key], 4) for n in sizes} for name, key in CPU_CURVES})
    curves["driver loop CPU per iteration"] = {str(n): round(jobs[n]["driver_iteration_cpu_s"], 6) for n in sizes}
    curves["pure core: one failure, CPU of the step"] = {str(n): round(core[n][CORE_FAILURE], 6) for n in core_sizes}
    notes = {
        "curves": curves,
        "harness": {str(n): job for n, job in jobs.items()},
        "harness_sizes_not_completed": failed,
        "core_cpu_s": {str(n): {case: round(v, 6) for case, v in costs.items()} for n, costs in core.items()},
        "core_memory_bytes_per_worker": {str(n): round(memory[n] / n) for n in core_sizes},
        "broadcast_100m_adam_gloo_s": {str(n): round(t, 3) for n, t in broadcast.items()},
        "bounds": "2 cores run Ray, the driver, the rendezvous and message actors and every simulated worker "
        "process at once; a simulated worker costs its process a thread and its heartbeat's, and every call it "
        "makes is a real Ray call.",
    }
    write_results("scale", rows, args.output, notes=notes)


if __name__ == "__main__":
    main()
