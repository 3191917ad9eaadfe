"""The scenario's durable trial, in a Tuner of its own: Tune keeps state per process, so two Tuners cannot share
one. Runs ``durable_objective`` on the cluster at ``--address``; each result becomes a JSON line in ``--results``.

A single-process function trial that counts, saves every 5 steps through ``save_async`` into its
``trial_store`` and reports every step, until ``--stop-file`` exists.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import ray
from ray import tune

from elastrain.tune import trial_store

KEEP = 2


def durable_objective(config: dict[str, Any]) -> None:
    import tempfile

    store = trial_store(config["storage"], num_to_keep=KEEP, storage_options=config["options"])
    step = 0
    while not os.path.exists(config["stop_file"]):
        step += 1
        time.sleep(0.05)
        if step % 5 == 0:
            with tempfile.TemporaryDirectory() as scratch:
                Path(scratch, "step").write_text(str(step))
                store.save_async(scratch, step=step, staging="copy")
        tune.report({"step": step, "t": time.time()})
    store.close()


class WriteResults(tune.Callback):
    def __init__(self, path: str) -> None:
        self.path = path

    def on_trial_result(
        self, iteration: int, trials: list[Any], trial: Any, result: dict[str, Any], **info: Any
    ) -> None:
        with open(self.path, "a") as out:
            out.write(
                json.dumps(
                    {"trial_id": trial.trial_id, "step": result["step"], "pid": result["pid"], "seen": time.time()}
                )
                + "\n"
            )


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("--address", "--storage", "--options", "--stop-file", "--results", "--tune-dir"):
        parser.add_argument(name, required=True)
    args = parser.parse_args()
    ray.init(address=args.address)
    trainable = tune.with_resources(durable_objective, tune.PlacementGroupFactory([{"trial_driver": 1}]))
    grid = tune.Tuner(
        trainable,
        param_space={"storage": args.storage, "options": json.loads(args.options), "stop_file": args.stop_file},
        run_config=tune.RunConfig(
            storage_path=args.tune_dir,
            name="durable",
            callbacks=[WriteResults(args.results)],
            failure_config=tune.FailureConfig(max_failures=1),
            verbose=0,
        ),
    ).fit()
    result = grid[0]
    with open(args.results, "a") as out:
        out.write(
            json.dumps({"final": True, "trial_id": result.metrics.get("trial_id"), "error": str(result.error or "")})
            + "\n"
        )


if __name__ == "__main__":
    main()
