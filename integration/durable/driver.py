"""A user's driver: an elastic job that persists its state and resumes from the latest persisted state.

Run by the scenario as a separate process, so that the scenario can kill it the hard way. Prints one line per
step of rank 0 (``STEP <n> <size>``) and, at the end, ``RESULT <json>``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--address", required=True)
    parser.add_argument("--uri", required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--storage-options", default="{}", help="JSON")
    args = parser.parse_args()

    import kit.training
    import ray
    from ray import cloudpickle

    from elastrain.durable import StatePersistence
    from elastrain.executor import RayExecutor

    cloudpickle.register_pickle_by_value(kit.training)
    ray.init(address=args.address, log_to_driver=False)
    persistence = StatePersistence(
        args.uri, every=5, num_to_keep=3, storage_options=json.loads(args.storage_options), timeout_s=60
    )

    def show(message: dict[str, object]) -> None:
        if message["rank"] == 0:
            print(f"STEP {message['step']} {message['size']}", flush=True)

    settings = RayExecutor.create_settings(timeout_s=60, discovery_interval_s=0.2)
    with RayExecutor(settings, min_workers=1, max_workers=2, cpus_per_worker=1, elastic_timeout=120) as executor:
        executor.start()
        results = executor.run(
            kit.training.train,
            args=[args.steps],
            kwargs={"persistence": persistence, "step_sleep_s": 0.05, "ballast_bytes": 1 << 20},
            callbacks=[show],
        )
    print("RESULT " + json.dumps(results), flush=True)
    ray.shutdown()
    os._exit(0)


if __name__ == "__main__":
    main()
