"""A sync whose source dies partway leaves every receiver's committed copy, and its commit count, as they were.

Two real processes on a real gloo group (no Ray): rank 0 is the source and is killed by the ``sync_mid`` fault
point once the model went out; rank 1 receives the model into its live state, then sees the group fail. Its
rollback must land on its own last commit, not on the source's model beside its own optimizer, whether it held
commits with work since (it would be the next source with that mix) or was a newcomer (it would start over from
it). Each process builds both ranks' states from seeds, so the receiver can tell what it got from whom.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

CHILD_TIMEOUT_S = 120.0

CHILD = textwrap.dedent(
    """
    import datetime, json, sys
    import torch
    import torch.distributed as dist
    from elastrain.executor import elastic
    from elastrain.executor._private.elastic.worker import runtime
    from elastrain.executor._private.elastic.worker.group import is_collective_failure

    rank, port, kind = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]

    def build(seed, steps):
        torch.manual_seed(seed)
        model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Linear(32, 4))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        for _ in range(steps):
            optimizer.zero_grad()
            model(torch.randn(8, 32)).pow(2).sum().backward()
            optimizer.step()
        return model, optimizer

    def flat(model):
        return torch.cat([t.detach().reshape(-1) for t in model.state_dict().values()])

    def committed_flat(state):
        return torch.cat([t.reshape(-1) for t in state._book.handlers["model"].saved.values()])

    def momentum(saved):
        return torch.cat([e["momentum_buffer"].reshape(-1) for e in saved["state"].values()])

    store = dist.TCPStore("127.0.0.1", port, 2, is_master=rank == 0, timeout=datetime.timedelta(seconds=30))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2, timeout=datetime.timedelta(seconds=30))
    runtime.install(runtime.Runtime(None, f"w{rank}", None))

    if rank == 0:  # the source: 3 commits, at its last one
        model, optimizer = build(seed=0, steps=3)
        state = elastic.TorchState(model, optimizer, step=3)
        state._book.commits, state._book.at_commit = 3, True
        state._synchronize()  # killed by the fault point once the model's tensors went out
        sys.exit("the source outlived its fault")

    source_model, _ = build(seed=0, steps=3)
    if kind == "between_commits":  # 3 commits too, then a step it never committed
        model, optimizer = build(seed=1, steps=2)
        state = elastic.TorchState(model, optimizer, step=2)
        state._book.commits = 3
        optimizer.step()
        state.step = 3
    else:  # a newcomer: its initial state, never trained, never synced
        model, optimizer = build(seed=1, steps=0)
        state = elastic.TorchState(model, optimizer, step=0)
    committed_model = committed_flat(state).clone()
    optimizer_saved = state._book.handlers["optimizer"].saved
    committed_momentum = momentum(optimizer_saved).clone() if optimizer_saved["state"] else None
    commits = state.commit_count
    try:
        state._synchronize()
        failure = None
    except Exception as error:
        failure = error
    result = {
        "failed_as_a_collective": failure is not None and is_collective_failure(failure),
        "model_arrived": torch.equal(flat(model), flat(source_model)),
        "committed_model_kept": torch.equal(committed_flat(state), committed_model),
        "committed_optimizer_kept": committed_momentum is None
        and not state._book.handlers["optimizer"].saved["state"]
        or committed_momentum is not None
        and torch.equal(momentum(state._book.handlers["optimizer"].saved), committed_momentum),
        "count_kept": state.commit_count == commits,
    }
    state._roll_back()
    result["rolled_back_to_own_commit"] = torch.equal(flat(model), committed_model)
    result["values_kept"] = state.step == (2 if kind == "between_commits" else 0)
    print(json.dumps(result), flush=True)
    """
)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.parametrize("kind", ["between_commits", "newcomer"])
def test_a_receiver_keeps_its_committed_copy_when_the_source_dies_mid_sync(tmp_path: Path, kind: str) -> None:
    marker = tmp_path / "fired"
    faults_file = tmp_path / "faults.json"
    # The model's four tensors travel in one bucket: two done means the model went out, the optimizer not.
    spec = {"point": "sync_mid", "role": "source", "action": "crash", "at": 2, "min_generation": 0}
    faults_file.write_text(json.dumps([{**spec, "marker": str(marker)}]))
    env = {**os.environ, "ELASTRAIN_FAULTS": str(faults_file)}
    port = free_port()
    children = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, str(rank), str(port), kind],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    try:
        outputs = [child.communicate(timeout=CHILD_TIMEOUT_S) for child in children]
    finally:
        for child in children:
            child.kill()
    assert children[0].returncode == -9, outputs[0]
    assert json.loads(marker.read_text())["role"] == "source"
    assert children[1].returncode == 0, outputs[1]
    result = json.loads(outputs[1][0].splitlines()[-1])
    assert result == {
        "failed_as_a_collective": True,
        "model_arrived": True,  # the failure came after part of the state was in: the case this guards
        "committed_model_kept": True,
        "committed_optimizer_kept": True,
        "count_kept": True,
        "rolled_back_to_own_commit": True,
        "values_kept": True,
    }
