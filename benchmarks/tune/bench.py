"""Ray Tune trials under node loss: an elastic 2-worker trial and a durable single-process trial, against Tune.

Every scenario runs in its own process with its own ``ray.cluster_utils.Cluster``: a head node without CPUs
that holds the trials' own processes where asked (resource ``trial_driver``) and two 2-CPU worker nodes, and
with Tune's ``storage_path`` and elastrain's stores on one SeaweedFS S3 server on 127.0.0.1. A worker node is
lost with ``remove_node(node, allow_graceful=False)``; times run from that call to the worker-side timestamp
``t`` of the first step after it, as the driver receives it in a ``tune.Callback``:

- node lost under a 2-worker trial: ``elastrain.tune.executor_trainable`` (``min_workers=1, max_workers=2``,
  SPREAD) going on with its survivor, against a Tune function trainable that starts its own 2-actor torch gloo
  group in its placement group and checkpoints to Tune's ``storage_path`` every 10 steps; when an actor's node
  dies it raises and Tune (``FailureConfig``) restarts the trial from its last checkpoint. The node that runs
  rank 1 is lost. Afterwards a node joins, and the notes give when the elastic trial is back at 2 workers.
- durable single-process trial: a function trainable on 1 CPU saving a 16 MiB model every 5 steps, with
  ``elastrain.tune.trial_store`` (``save_async``; a restart starts ``restore_async`` before importing torch) or
  with Tune's own ``tune.report(checkpoint=...)`` to ``storage_path`` (restored with
  ``tune.get_checkpoint().as_directory()`` after importing torch). Ours runs twice: with pyarrow's S3 client
  (``ArrowSyncClient``, the target row) and with the default s3fs client. The node it runs on is lost; after the
  run, both must keep exactly ``num_to_keep`` checkpoints.

On this kind of Cluster a hard node loss fails pending actor calls with ``ActorUnavailableError`` after ~1.9 s,
but the GCS declares the node dead (and places its placement-group bundles again) only after ~15 s: what waits
for which is part of what is compared. Every scenario runs ``REPEATS`` times (the durable ones
``DURABLE_REPEATS``); rows show medians.

This module runs the scenarios and writes the rows; the cases are in ``elastic_trial.py`` and
``durable_trial.py``, what they share (the Cluster, SeaweedFS, the Tune callback, the node loss) in
``cluster.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import cluster
import durable_trial
import elastic_trial

from benchlib import Row, median_of_runs, parse_args, write_results

REPEATS = 3
# The durable rows compare whole restarts whose Tune-side part (detection, rescheduling) alone varies by ±0.3 s
# between runs: more runs for a steadier median.
DURABLE_REPEATS = 5
CHILD_TIMEOUT_S = 600
RESULT_PREFIX = "BENCH-RESULT "

SCENARIOS: dict[str, Callable[[], dict[str, Any]]] = {
    "elastrain_pair": elastic_trial.elastrain_pair,
    "tune_pair": elastic_trial.tune_pair_restart,
    "elastrain_durable": durable_trial.elastrain_durable,
    "elastrain_durable_arrow": durable_trial.elastrain_durable_arrow,
    "tune_durable": durable_trial.tune_durable,
}


def _pickle_by_value() -> None:
    """Ray ships this folder's functions with their code, as it did while they lived in ``__main__``: no Ray
    worker imports these modules by name (their folder is on no worker's path)."""
    from ray import cloudpickle

    for module in (cluster, elastic_trial, durable_trial):
        cloudpickle.register_pickle_by_value(module)


# -- the parent: each run in a fresh process --------------------------------------------------------------------


def measure_in_child(name: str, repeats: int, s3: dict[str, Any]) -> dict[str, Any] | None:
    """Median of each measured value over ``repeats`` runs of the scenario, each in its own process."""
    return median_of_runs([run for run in (_one_child_run(name, s3) for _ in range(repeats)) if run is not None])


def _one_child_run(name: str, s3: dict[str, Any]) -> dict[str, Any] | None:
    command = [sys.executable, __file__, "--scenario", name]
    env = {**os.environ, cluster.S3_ENV: json.dumps(s3)}
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S, check=False, env=env)
    except subprocess.TimeoutExpired:
        print(f"scenario {name} timed out", file=sys.stderr)
        return None
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    if done.returncode != 0 or not lines:
        print(f"scenario {name} failed:\n{done.stderr[-4000:]}", file=sys.stderr)
        return None
    result = dict(json.loads(lines[-1].removeprefix(RESULT_PREFIX)))
    print(f"scenario {name}: {json.dumps(result)}", file=sys.stderr, flush=True)
    return result


def main() -> None:
    if "--scenario" in sys.argv:
        _pickle_by_value()
        result = SCENARIOS[sys.argv[sys.argv.index("--scenario") + 1]]()
        # A line of its own that the parent looks for: Ray and Tune may print after it.
        print(RESULT_PREFIX + json.dumps(result, default=str), flush=True)
        return
    args = parse_args(__doc__ or "")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    repeats = 1 if args.quick else REPEATS
    from elastrain_testutils.storage_servers import SeaweedS3

    with SeaweedS3() as server:
        s3 = cluster.serve(server)
        results = {
            name: measure_in_child(name, repeats if args.quick or "durable" not in name else DURABLE_REPEATS, s3)
            for name in SCENARIOS
        }
    rows: list[Row] = []
    ours, theirs = results.get("elastrain_pair"), results.get("tune_pair")
    if ours and theirs:
        rows.append(
            Row("node lost under a 2-worker trial", "hard node loss → next step", ours["recovery_s"],
                "Ray Tune restart of a 2-worker trial (torch gloo group, FailureConfig)", theirs["recovery_s"], 0.1)
        )  # fmt: skip
    ours_durable, tune_durable_ = results.get("elastrain_durable"), results.get("tune_durable")
    ours_arrow = results.get("elastrain_durable_arrow")
    if ours_arrow and tune_durable_:
        rows.append(
            Row("durable single-process trial, node lost", "node loss → first step after restore (ArrowSyncClient)",
                ours_arrow["recovery_s"], "Ray Tune storage_path persistence (pyarrow S3)",
                tune_durable_["recovery_s"], 1.0)
        )  # fmt: skip
    if ours_arrow and tune_durable_ and "event_start_s" in ours_arrow and "event_start_s" in tune_durable_:
        rows.append(
            Row("durable single-process trial, node lost",
                "restarted trial's start → first step (ArrowSyncClient; the trial's own part)",
                ours_arrow["recovery_s"] - ours_arrow["event_start_s"], "Ray Tune storage_path persistence",
                tune_durable_["recovery_s"] - tune_durable_["event_start_s"], None)
        )  # fmt: skip
    if ours_durable and tune_durable_:
        rows.append(
            Row("durable single-process trial, node lost", "same, default client (s3fs)",
                ours_durable["recovery_s"], "Ray Tune storage_path persistence (pyarrow S3)",
                tune_durable_["recovery_s"], None)
        )  # fmt: skip

    def pick(name: str, *keys: str) -> dict[str, Any]:
        found = results.get(name) or {}
        return {key: found.get(key) for key in keys if key in found}

    breakdown = ("remove_node_s", "gcs_node_dead_s", "trial_error")
    kept_ours = [
        *(ours_durable or {}).get("samples", {}).get("checkpoints_kept", []),
        *(ours_arrow or {}).get("samples", {}).get("checkpoints_kept", []),
    ]
    kept_tune = (tune_durable_ or {}).get("samples", {}).get("checkpoints_kept", [])
    notes = {
        "failed_scenarios": [name for name, value in results.items() if value is None],
        "repeats": repeats,
        "elastic_trial": pick(
            "elastrain_pair",
            "restarted_by_tune",
            "node_added_to_2_workers_s",
            "lost_to_2_workers_s",
            "grow_back",
            *breakdown,
        ),
        "tune_pair_restart": {
            key: value
            for key, value in (results.get("tune_pair") or {}).items()
            if key.startswith("event_") or key in (*breakdown, "failed_with")
        },
        "checkpoints_kept": {  # each run's count once the trial ended
            "num_to_keep": cluster.KEEP,
            "elastrain_trial_store": kept_ours,
            "tune_storage_path": kept_tune,
            "elastrain_exactly_num_to_keep": bool(kept_ours) and all(count == cluster.KEEP for count in kept_ours),
        },
        "durable_restart": {
            name: {
                key: value
                for key, value in (results.get(name) or {}).items()
                if key.startswith("event_") or key in (*breakdown, "restored_step")
            }
            for name in ("elastrain_durable", "elastrain_durable_arrow", "tune_durable")
        },
        "samples_s": {name: value["samples"] for name, value in results.items() if value},
    }
    write_results("tune", rows, args.output, notes=notes)


if __name__ == "__main__":
    main()
