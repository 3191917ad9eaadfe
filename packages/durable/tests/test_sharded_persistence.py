"""Sharded checkpoints of an FSDP2 job on a real S3 server (SeaweedFS): every rank uploads its part, one manifest
commits them, a fresh job of another size resumes from the latest, and plain PyTorch DCP reads a downloaded copy
with no elastrain installed.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import new_bucket

from elastrain.durable import CheckpointStore, ShardedStatePersistence, StatePersistence
from elastrain.executor import elastic as executor_elastic
from elastrain_testutils.ray_testing import local_ray, ship_by_value
from elastrain_testutils.storage_servers import SeaweedS3

FEATURES, BATCH, LR = 6, 12, 0.01

# The state that writes sharded checkpoints is the executor's, from its release after 0.1.0. The upgrade cell of
# the matrix (this checkout's durable against the executor's previous release) has none to drive; it still tests the
# rest of this package.
pytestmark = pytest.mark.skipif(
    not hasattr(executor_elastic, "ShardedTorchState"),
    reason="needs elastrain-executor > 0.1.0 (elastic.ShardedTorchState); the installed executor predates it",
)


@pytest.fixture(scope="module", autouse=True)
def ray_local(request: pytest.FixtureRequest) -> Iterator[None]:
    ship_by_value(request.module)
    with local_ray(num_cpus=4):
        yield


def make_model() -> Any:
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 10), torch.nn.Tanh(), torch.nn.Linear(10, 2))


def batch_for(step: int) -> tuple[Any, Any]:
    import torch

    generator = torch.Generator().manual_seed(1000 + step)
    inputs = torch.randn(BATCH, FEATURES, generator=generator)
    return inputs, torch.stack([inputs.sum(1), inputs[:, 0]], dim=1)


def train_fsdp(last: int, persistence: ShardedStatePersistence) -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    from elastrain.executor import elastic

    def build(mesh: Any) -> Any:
        model = make_model()
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model, torch.optim.AdamW(model.parameters(), lr=LR)

    state = elastic.ShardedTorchState(build, step=0)
    state.persist_with(persistence)

    @elastic.run
    def loop(state: elastic.ShardedTorchState) -> dict[str, Any]:
        model, optimizer = state.model, state.optimizer
        first = state.step
        rank, size = dist.get_rank(), dist.get_world_size()
        while state.step < last:
            inputs, targets = batch_for(state.step)
            shard = slice(rank * BATCH // size, (rank + 1) * BATCH // size)
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(inputs[shard]), targets[shard]).backward()
            optimizer.step()
            state.step += 1
            state.commit()
        with torch.no_grad():
            weights = {name: t.full_tensor().clone() for name, t in model.state_dict().items()}
        return {"first_step": first, "load": state.last_load, "weights": weights}

    result: dict[str, Any] = loop(state)
    return result


def reference(steps: int) -> dict[str, Any]:
    import torch

    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    for step in range(steps):
        inputs, targets = batch_for(step)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(inputs), targets).backward()
        optimizer.step()
    return {name: t.detach().clone() for name, t in model.state_dict().items()}


def run_job(workers: int, last: int, persistence: ShardedStatePersistence) -> list[dict[str, Any]]:
    from elastrain.executor import RayExecutor

    settings = RayExecutor.create_settings(timeout_s=60)
    with RayExecutor(settings, min_workers=workers, max_workers=workers, cpus_per_worker=0.5) as executor:
        executor.start()
        results: list[dict[str, Any]] = executor.run(train_fsdp, args=[last, persistence])
        return results


def test_an_fsdp_job_writes_sharded_checkpoints_that_resume_at_any_size_and_load_without_elastrain(
    seaweed_s3: SeaweedS3, tmp_path: Path
) -> None:
    import torch

    options = seaweed_s3.storage_options()
    uri = f"s3://{new_bucket(seaweed_s3)}/fsdp-job"
    persistence = ShardedStatePersistence(uri, every=3, num_to_keep=2, storage_options=options)
    first = run_job(2, 9, persistence)
    assert [r["first_step"] for r in first] == [0, 0]
    with CheckpointStore(uri, storage_options=options) as store:
        kept = store.list()
        assert [c.step for c in kept] == [6, 9]  # every third commit, two kept
        files = sorted(entry.path for entry in kept[-1].files)
    assert files[0] == ".metadata"
    assert {path.split("/")[0] for path in files[1:]} == {"part-00000", "part-00001"}  # one part per rank

    second = run_job(3, 12, persistence)  # a fresh job of another size resumes from commit 9
    expected = reference(12)
    for result in second:
        assert result["first_step"] == 9
        assert (result["load"]["path"], result["load"]["commits"]) == ("persisted", 9)
        for name, tensor in expected.items():
            torch.testing.assert_close(result["weights"][name], tensor, rtol=1e-5, atol=1e-6)

    # The latest checkpoint (commit 12, three parts) as plain DCP: torch alone reads it, elastrain blocked.
    copy = tmp_path / "downloaded"
    with CheckpointStore(uri, storage_options=options) as store:
        assert store.latest() is not None
        store.restore(local_dir=copy)
    out = tmp_path / "plain.pt"
    script = (
        "import sys; sys.modules['elastrain'] = None\n"
        "from torch.distributed.checkpoint.format_utils import dcp_to_torch_save\n"
        f"dcp_to_torch_save({str(copy)!r}, {str(out)!r})\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)
    plain = torch.load(out, weights_only=False)
    for name, tensor in expected.items():
        torch.testing.assert_close(plain["model"][name], tensor, rtol=1e-5, atol=1e-6)
    assert set(plain["optimizer"]["state"]) == set(expected)  # Adam's moments, by parameter name


def make_wide_model() -> Any:
    """Tensors of about equal size, so that DCP can give each of N ranks about 1/N of the bytes."""
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(*(torch.nn.Linear(64, 64, bias=False) for _ in range(6)))


def train_ddp(last: int, persistence: ShardedStatePersistence) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from elastrain.executor import elastic

    model = make_wide_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    state = elastic.TorchState(model, optimizer, step=0)
    state.persist_with(persistence)
    ddp = elastic.DistributedDataParallel(model)

    @elastic.run
    def loop(state: elastic.TorchState) -> dict[str, Any]:
        first = state.step
        started = {"model": model.state_dict(), "optimizer": optimizer.state_dict()["state"]}
        started = {k: {n: _cloned(v) for n, v in d.items()} for k, d in started.items()}
        rank, size = dist.get_rank(), dist.get_world_size()
        while state.step < last:
            generator = torch.Generator().manual_seed(2000 + state.step)
            inputs = torch.randn(BATCH, 64, generator=generator)
            shard = slice(rank * BATCH // size, (rank + 1) * BATCH // size)
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(ddp(inputs[shard]), inputs[shard].flip(1)).backward()
            optimizer.step()
            state.step += 1
            state.commit()
        ended = {"model": model.state_dict(), "optimizer": optimizer.state_dict()["state"]}
        ended = {k: {n: _cloned(v) for n, v in d.items()} for k, d in ended.items()}
        return {"first_step": first, "started": started, "ended": ended}

    result: dict[str, Any] = loop(state)
    return result


def _cloned(value: Any) -> Any:
    import copy

    return copy.deepcopy(value)


def run_ddp_job(workers: int, last: int, persistence: ShardedStatePersistence) -> list[dict[str, Any]]:
    from elastrain.executor import RayExecutor

    settings = RayExecutor.create_settings(timeout_s=60)
    with RayExecutor(settings, min_workers=workers, max_workers=workers, cpus_per_worker=0.5) as executor:
        executor.start()
        results: list[dict[str, Any]] = executor.run(train_ddp, args=[last, persistence])
        return results


def test_a_ddp_state_is_written_in_shares_by_every_rank_and_resumes_at_any_size(
    seaweed_s3: SeaweedS3, tmp_path: Path
) -> None:
    import torch

    options = seaweed_s3.storage_options()
    uri = f"s3://{new_bucket(seaweed_s3)}/ddp-job"
    persistence = ShardedStatePersistence(uri, every=4, num_to_keep=1, storage_options=options)
    first = run_ddp_job(3, 8, persistence)
    assert [r["first_step"] for r in first] == [0, 0, 0]
    with CheckpointStore(uri, storage_options=options) as store:
        latest = store.latest()
        assert latest is not None
        assert latest.step == 8
        by_part: dict[str, int] = {}
        for entry in latest.files:
            if "/" in entry.path:
                part = entry.path.split("/")[0]
                by_part[part] = by_part.get(part, 0) + entry.size
    # Every rank holds all of it; each wrote about a third (6 weights and their 12 moments over 3 ranks).
    assert sorted(by_part) == ["part-00000", "part-00001", "part-00002"]
    total = sum(by_part.values())
    assert max(by_part.values()) < 0.45 * total, by_part

    second = run_ddp_job(2, 12, persistence)  # a fresh job of another size resumes from commit 8
    assert [r["first_step"] for r in second] == [8, 8]
    for result in second:  # exactly the state commit 8 left: weights, Adam's moments and step counts
        torch.testing.assert_close(result["started"], first[0]["ended"], rtol=0, atol=0)

    # Plain DCP, elastrain blocked: the model's weights load into a model's own state dict.
    copy = tmp_path / "downloaded"
    with CheckpointStore(uri, storage_options=options) as store:
        store.restore(local_dir=copy)
    out = tmp_path / "model.pt"
    script = (
        "import sys; sys.modules['elastrain'] = None\n"
        "import torch, torch.distributed.checkpoint as dcp\n"
        "model = torch.nn.Sequential(*(torch.nn.Linear(64, 64, bias=False) for _ in range(6)))\n"
        "state = {'model': model.state_dict()}\n"
        f"dcp.load(state, checkpoint_id={str(copy)!r}, no_dist=True)\n"
        f"torch.save(state['model'], {str(out)!r})\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)
    plain = torch.load(out, weights_only=True)
    with CheckpointStore(uri, storage_options=options) as store:
        assert store.latest().step == 12  # type: ignore[union-attr]
    torch.testing.assert_close(plain, second[0]["ended"]["model"], rtol=0, atol=0)


def test_whole_and_sharded_persistence_say_which_state_they_fit() -> None:
    from elastrain.executor import elastic

    state = elastic.ObjectState(step=0)
    state.persist_with(ShardedStatePersistence("memory://job", every=2))  # every rank writes a share
    assert "ShardedStatePersistence" in repr(state._book.persistence)
    sharded = elastic.ShardedTorchState(lambda mesh: mesh)
    with pytest.raises(TypeError, match="ShardedStatePersistence"):
        sharded.persist_with(StatePersistence("memory://job-2", every=2))
