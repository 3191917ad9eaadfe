"""Durable single-process trial, node lost: a function trainable saving a 16 MiB model every few steps through
``elastrain.tune.trial_store`` (``elastrain_durable`` with the default s3fs client, ``elastrain_durable_arrow``
with ``ArrowSyncClient``), or through Tune's own ``tune.report(checkpoint=...)`` to ``storage_path``
(``tune_durable``); afterwards, how many checkpoints each kept.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cluster import (
    BUCKET,
    KEEP,
    RESULTS,
    START_TIMEOUT_S,
    STEP_S,
    first_of_restarted,
    log_event,
    node_loss,
    stop_step,
    worker_node,
)

DURABLE_SAVE_EVERY = 5
DURABLE_WIDTH = 2048  # Linear(2048, 2048) without bias: a 16 MiB float32 checkpoint


# -- what runs in the trials ----------------------------------------------------------------------------------


def _durable_model() -> tuple[Any, Any]:
    import torch

    model = torch.nn.Linear(DURABLE_WIDTH, DURABLE_WIDTH, bias=False)
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def _durable_step(model: Any, optimizer: Any) -> None:
    import torch

    optimizer.zero_grad()
    model(torch.randn(8, DURABLE_WIDTH)).pow(2).mean().backward()
    optimizer.step()


def _save_durable(model: Any, step: int, folder: str) -> None:
    import torch

    torch.save(model.state_dict(), os.path.join(folder, "model.pt"))
    Path(folder, "step").write_text(str(step))


def _load_durable(model: Any, folder: str) -> int:
    import torch

    model.load_state_dict(torch.load(os.path.join(folder, "model.pt")))
    return int(Path(folder, "step").read_text())


def durable_ours(config: dict[str, Any]) -> None:
    """elastrain: the trial's own CheckpointStore; a restart starts the download before importing torch."""
    import ray
    from ray import tune

    import elastrain.tune
    from elastrain.durable import CheckpointNotFoundError

    log_event(config, "start")
    if config.get("client") == "arrow":  # pyarrow's S3 client: what docs/tune.md recommends on S3
        import pyarrow.fs

        from elastrain.durable import ArrowSyncClient

        client = ArrowSyncClient(pyarrow.fs.S3FileSystem(**config["arrow"]))
        store = elastrain.tune.trial_store(config["storage"], num_to_keep=KEEP, sync_client=client)
    else:
        store = elastrain.tune.trial_store(config["storage"], num_to_keep=KEEP, storage_options=config["options"])
    log_event(config, "store open")
    scratch = tempfile.mkdtemp(prefix="bench-tune-restore-")
    # The latest checkpoint, if any, downloads in the background (trial_store checks the folder there too).
    restoring = store.restore_async(local_dir=os.path.join(scratch, "restored"))
    restoring.add_done_callback(lambda _: log_event(config, "downloaded"))
    import torch  # noqa: F401 - what a user's trainable does next, while the checkpoint downloads

    model, optimizer = _durable_model()
    log_event(config, "model built")
    step = 0
    try:
        restoring.result(timeout=START_TIMEOUT_S)
    except CheckpointNotFoundError:
        pass  # a fresh trial
    else:
        step = _load_durable(model, os.path.join(scratch, "restored"))
        log_event(config, "restored", step=step)
    shutil.rmtree(scratch, ignore_errors=True)
    restored_step, node = step, ray.get_runtime_context().get_node_id()
    while step < stop_step(config["stop_file"]):
        step += 1
        _durable_step(model, optimizer)
        t = time.time()
        if step % DURABLE_SAVE_EVERY == 0:
            folder = tempfile.mkdtemp(prefix="bench-tune-save-")
            _save_durable(model, step, folder)
            store.save_async(folder, step=step, staging="move")  # returns once handed over; uploads meanwhile
        tune.report({"step": step, "t": t, "node": node, "restored_step": restored_step})
        time.sleep(STEP_S)
    store.close()  # the last upload and the collection after it


def durable_tune(config: dict[str, Any]) -> None:
    """Tune baseline: checkpoints through ``tune.report`` to ``storage_path``, restored as users write it."""
    import ray
    from ray import tune

    log_event(config, "start")
    checkpoint = tune.get_checkpoint()
    import torch  # noqa: F401

    model, optimizer = _durable_model()
    log_event(config, "model built")
    step = 0
    if checkpoint is not None:
        with checkpoint.as_directory() as folder:
            step = _load_durable(model, folder)
        log_event(config, "restored", step=step)
    restored_step, node = step, ray.get_runtime_context().get_node_id()
    while step < stop_step(config["stop_file"]):
        step += 1
        _durable_step(model, optimizer)
        t = time.time()
        metrics = {"step": step, "t": t, "node": node, "restored_step": restored_step}
        if step % DURABLE_SAVE_EVERY:
            tune.report(metrics)
        else:
            with tempfile.TemporaryDirectory(prefix="bench-tune-save-") as folder:
                _save_durable(model, step, folder)
                tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(folder))
        time.sleep(STEP_S)


# -- scenarios --------------------------------------------------------------------------------------------------


def _durable(
    name: str, function: Callable[[dict[str, Any]], None], ours: bool, client: str | None = None
) -> dict[str, Any]:
    from ray import tune

    from elastrain_testutils.storage_servers import ACCESS_KEY, SECRET_KEY

    def make(s3: dict[str, Any], config: dict[str, Any]) -> Any:
        if client == "arrow":
            config["client"] = "arrow"
            config["arrow"] = {
                "access_key": ACCESS_KEY,
                "secret_key": SECRET_KEY,
                "endpoint_override": s3["endpoint"].removeprefix("http://"),
                "scheme": "http",
            }
        return tune.with_resources(function, tune.PlacementGroupFactory([{"CPU": 1}]))

    def ready(results: list[dict[str, Any]]) -> bool:
        return any(r["step"] >= 3 * DURABLE_SAVE_EVERY + 2 for r in results)

    def victim(results: list[dict[str, Any]], cluster: Any) -> Any:
        return worker_node(cluster, results[-1]["node"])

    def recovered(results: list[dict[str, Any]], killed_at: float) -> dict[str, Any] | None:
        first = first_of_restarted(results, killed_at)
        if first is None:
            return None
        return {
            "recovery_s": first["t"] - killed_at,
            "restored_step": first["restored_step"],
            "first_step_after": first,
        }

    def kept(s3: dict[str, Any], run: str, experiment: str) -> dict[str, Any]:
        """What each keeps once the trial ended: elastrain's store, or Tune's checkpoint folders."""
        if ours:
            from elastrain.durable import CheckpointStore

            trial_ids = {r["trial_id"] for r in RESULTS}
            counts = []
            for trial_id in sorted(trial_ids):
                store = CheckpointStore(
                    f"s3://{BUCKET}/{run}/elastrain/{experiment}/{trial_id}", storage_options=s3["options"]
                )
                counts.append(len(store.list()))
                store.close()
            return {"checkpoints_kept": counts[0] if len(counts) == 1 else counts}
        import s3fs

        fs = s3fs.S3FileSystem(**s3["options"], skip_instance_cache=True)
        folders = fs.glob(f"{BUCKET}/{run}/tune/{experiment}/*/checkpoint_*")
        return {"checkpoints_kept": len(folders)}

    return node_loss(
        name,
        make,
        ready=ready,
        victim=victim,
        recovered=recovered,
        checkpoint_config=None if ours else tune.CheckpointConfig(num_to_keep=KEEP),
        finished=kept,
    )


def elastrain_durable() -> dict[str, Any]:
    return _durable("durable-ours", durable_ours, ours=True)


def elastrain_durable_arrow() -> dict[str, Any]:
    return _durable("durable-ours-arrow", durable_ours, ours=True, client="arrow")


def tune_durable() -> dict[str, Any]:
    return _durable("durable-tune", durable_tune, ours=False)
