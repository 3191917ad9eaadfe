"""ShardedTorchState across real worlds of processes: an FSDP2 model loses a worker, shrinks, grows, and ends with
the failure-free run's weights; losing a shard and its buddy at once loses the state, and says so.

The worlds are formed by ``sharded_local.py`` (gloo on a fresh store per world, no Ray): the state, its copies,
its buddy ring and every transfer are the real ones.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import torch
from sharded_local import reference, run_script

pytest.importorskip("torch.distributed.fsdp")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def assert_failed_fast(results: dict) -> None:
    """Every survivor's failed collective failed because a peer's connection closed, none by waiting out the
    timeout: a worker leaving a failed world frees its group, so no peer is left waiting on it."""
    for result in results.values():
        for failure in result["failures"]:
            assert "Timed out" not in failure, failure


def assert_weights_match(result: dict, steps: int) -> None:
    expected = reference(steps)
    assert result["step"] == steps
    for name, tensor in expected.items():
        torch.testing.assert_close(torch.tensor(result["weights"][name]), tensor, rtol=1e-5, atol=1e-6)


def test_a_lost_worker_is_recovered_from_memory_and_a_newcomer_joins(tmp_path: Path) -> None:
    # Workers 2 and 3 move down a rank, and the last world has the first one's shape: a mesh equal to an earlier
    # world's (torch's caches compare meshes by shape and ranks) must not place their chunks as it did then.
    script = {
        "worlds": [[free_port(), [0, 1, 2, 3], 12], [free_port(), [0, 2, 3], 10], [free_port(), [0, 2, 3, 4], 14]],
        "exits": {"1": 5},  # worker 1 dies after its 5th commit; the others fail in step 6
        "linger_s": 0.3,  # long enough for its copy of commit 5 to reach its buddy
    }
    results = run_script(script, tmp_path)
    assert sorted(results) == [0, 2, 3, 4], results
    assert_failed_fast(results)
    for _worker, result in results.items():
        assert "error" not in result, result
        assert_weights_match(result, 14)
    survivor = results[0]["loads"]
    assert [load["path"] for load in survivor] == ["fresh", "memory", "memory"]
    lost, grown = survivor[1], survivor[2]
    assert (lost["commits"], lost["lost_commits"]) == (5, 0)  # nothing committed was lost
    assert grown["commits"] == 10
    newcomer = results[4]["loads"]
    assert [load["path"] for load in newcomer] == ["memory"]
    assert newcomer[0]["received_bytes"] > 0
    assert newcomer[0]["local_bytes"] == 0


def test_an_hsdp_replica_holds_what_a_lost_worker_sharded_without_buddy_copies(tmp_path: Path) -> None:
    """A 2 x 2 (replicate, shard) mesh keeps every chunk on two ranks, so with no buddy copies at all a lost worker
    is still recovered from memory: from its replica. The world of 3 shards over all ranks; a newcomer makes it
    2 x 2 again."""
    script = {
        "worlds": [[free_port(), [0, 1, 2, 3], 12], [free_port(), [0, 2, 3], 10], [free_port(), [0, 2, 3, 4], 14]],
        "exits": {"1": 5},
        "every": 0,
        "hsdp": True,
    }
    results = run_script(script, tmp_path)
    assert sorted(results) == [0, 2, 3, 4], results
    assert_failed_fast(results)
    for result in results.values():
        assert "error" not in result, result
        assert_weights_match(result, 14)
    survivor = results[0]["loads"]
    assert [load["path"] for load in survivor] == ["fresh", "memory", "memory"]
    assert (survivor[1]["commits"], survivor[1]["lost_commits"]) == (5, 0)
    assert [load["path"] for load in results[4]["loads"]] == ["memory"]


def test_an_hsdp_replica_group_that_went_on_keeps_its_shards_at_other_ranks(tmp_path: Path) -> None:
    """Replica groups (0, 1) and (2, 3); worker 0 dies. The untouched group goes on alone, while worker 1 waits
    outside (``size_multiple``). Then 1 and a newcomer come back, and ranks follow the hosts: 2 and 3 become
    ranks 1 and 2, whose plain places would be a row apart and the other shard each. The mesh is arranged so
    that they stay one row, each in its shard: neither receives anything, and the two others receive their
    chunks from them. Last, 1 and 2 die at once (one shard, both replicas): the state resumes from the sharded
    checkpoint written on the arranged mesh, and ends with the failure-free weights."""
    folder = tmp_path / "checkpoints"
    script = {
        "worlds": [
            [free_port(), [0, 1, 2, 3], 12],
            [free_port(), [2, 3], 8],
            [free_port(), [1, 2, 3, 4], 12],
            [free_port(), [3, 4], 14],
        ],
        "exits": {"0": 5, "1": 11, "2": 11},
        "linger_s": 1.0,  # the checkpoint of commit 10 is committed before they die
        "every": 0,
        "hsdp": True,
        "persist": {"folder": str(folder), "every": 2},
    }
    results = run_script(script, tmp_path, timeout_s=180)
    assert sorted(results) == [3, 4], results
    assert_failed_fast(results)
    for result in results.values():
        assert "error" not in result, result
        assert_weights_match(result, 14)
    fresh, alone, healed, resumed = results[3]["loads"]
    assert fresh["path"] == "fresh"
    assert (alone["path"], alone["commits"], alone["received_bytes"]) == ("memory", 5, 0)
    assert (healed["path"], healed["commits"], healed["received_bytes"]) == ("memory", 8, 0)
    assert healed["sent_bytes"] > 0
    newcomer = results[4]["loads"][0]
    assert (newcomer["path"], newcomer["commits"]) == ("memory", 8)
    assert newcomer["received_bytes"] > 0
    assert (resumed["path"], resumed["commits"]) == ("persisted", 10)


def test_losing_a_shard_and_its_buddy_at_once_loses_the_state(tmp_path: Path) -> None:
    script = {
        "worlds": [[free_port(), [0, 1, 2, 3], 12], [free_port(), [0, 1], 12]],
        "exits": {"2": 4, "3": 4},  # rank 2's chunks lived on rank 2 and on its buddy, rank 3
        "linger_s": 0.3,
    }
    results = run_script(script, tmp_path)
    assert sorted(results) == [0, 1]
    assert_failed_fast(results)
    for result in results.values():
        assert "ElasticJobError" in result["error"], result
        assert "lost with its last holder" in result["error"]


def test_without_redundancy_one_lost_worker_loses_the_state(tmp_path: Path) -> None:
    script = {
        "worlds": [[free_port(), [0, 1, 2], 12], [free_port(), [0, 1], 12]],
        "exits": {"2": 3},
        "every": 0,
    }
    results = run_script(script, tmp_path)
    assert sorted(results) == [0, 1]
    assert all("ElasticJobError" in r["error"] for r in results.values()), results


def test_a_state_lost_from_memory_resumes_from_its_sharded_checkpoint_at_another_world_size(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoints"
    script = {
        "worlds": [[free_port(), [0, 1, 2, 3], 12], [free_port(), [0, 1, 2], 12]],
        "exits": {"3": 5},
        "every": 0,  # no in-memory copies: losing a worker loses a shard
        "persist": {"folder": str(folder), "every": 2},
    }
    results = run_script(script, tmp_path)
    assert sorted(results) == [0, 1, 2]
    assert_failed_fast(results)
    for result in results.values():
        assert "error" not in result, result
        assert_weights_match(result, 12)
        resumed = result["loads"][1]
        assert resumed["path"] == "persisted"
        assert resumed["commits"] in (2, 4)  # commit 4's checkpoint may still have been on its way
        assert resumed["lost_commits"] == 5 - resumed["commits"]
    committed = sorted(p.parent.name for p in folder.glob("*/COMMITTED"))
    assert committed[-1] == "step-000012"  # the last due commit was written before the job returned
    parts = sorted(p.name for p in (folder / "step-000012").iterdir())
    assert parts == [".metadata", "COMMITTED", "part-00000", "part-00001", "part-00002"]


def test_a_mesh_shape_must_cover_the_world() -> None:
    from elastrain.executor import elastic
    from elastrain.executor._private.elastic.worker.sharded_live import mesh_dims

    with pytest.raises(TypeError, match="mesh_shape is a function of the world size"):
        elastic.ShardedTorchState(lambda mesh: mesh, mesh_shape=(2, 2))  # type: ignore[arg-type]
    assert mesh_dims(None, 3) == ((3,), None)
    assert mesh_dims(lambda n: (n // 2, 2), 4) == ((2, 2), ("replicate", "shard"))
    for bad in (lambda n: (n // 2, 2), lambda n: [1, n], lambda n: (0, n), lambda n: (1, n, 1)):
        with pytest.raises(ValueError, match=r"mesh_shape\(3\) must return \(replicas, shard_size\)"):
            mesh_dims(bad, 3)
