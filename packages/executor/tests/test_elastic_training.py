"""Elastic jobs written as PyTorch users write them: DDP, samplers, LR schedulers, reset callbacks.

Every job checks itself: after each step the workers compare their weights and learning rate with two small
all-reduces and report any difference, so a replica that silently diverged fails the test. Failures are
injected the way they happen (a worker exits hard at a step; discovery adds or drops hosts); all hosts are
fake ``node:host-N`` resources on one Ray node.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from elastic_training_kit import (
    BATCH,
    Recorder,
    batch_for,
    crash_if_marked,
    elastic_executor,
    last_step,
    make_model,
)

from elastrain.discovery import StaticHostDiscovery
from elastrain.executor import context, elastic, init_process_group, send

# One Ray node whose fake resources stand for five hosts (conftest.py), shared by the module.
pytestmark = pytest.mark.usefixtures("ray_with_scripted_hosts")


def check_replicas_agree(model: Any, optimizer: Any, step: int) -> None:
    """Every rank holds the same weights and learning rate (min == max over the group), or says so."""
    import torch
    import torch.distributed as dist

    with torch.no_grad():
        checksum = sum(float(p.double().sum()) for p in model.parameters())
    values = torch.tensor([checksum, optimizer.param_groups[0]["lr"]], dtype=torch.float64)
    low, high = values.clone(), values.clone()
    dist.all_reduce(low, op=dist.ReduceOp.MIN)
    dist.all_reduce(high, op=dist.ReduceOp.MAX)
    if not torch.equal(low, high):
        send({"event": "diverged", "step": step, "low": low.tolist(), "high": high.tolist()})


def train_ddp(steps: int | str, crash_dir: str | None, base_lr: float = 0.05) -> dict[str, Any]:
    """Horovod's shape: init, DDP, optimizer with lr * size, scheduler and reset callback, all before the loop."""
    import torch
    import torch.distributed as dist

    init_process_group()
    send({"event": "init", "rank": context().rank, "size": dist.get_world_size(), "pid": os.getpid()})
    model = elastic.DistributedDataParallel(make_model())
    optimizer = torch.optim.SGD(model.parameters(), lr=base_lr * dist.get_world_size(), momentum=0.9)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda epoch: 0.5 ** (epoch // 4))
    state = elastic.TorchState(model, optimizer, scheduler=scheduler, step=0)

    def rescale_lr() -> None:  # Horovod's canonical reset callback
        factor = 0.5 ** (scheduler.last_epoch // 4)
        for group in optimizer.param_groups:
            group["lr"] = base_lr * dist.get_world_size() * factor
        scheduler.base_lrs = [base_lr * dist.get_world_size()] * len(optimizer.param_groups)

    state.register_reset_callbacks([rescale_lr])

    @elastic.run
    def loop(state: elastic.TorchState) -> dict[str, Any]:
        assert state.model is model
        assert state.optimizer is optimizer
        assert state.scheduler is scheduler
        while state.step < last_step(steps):
            rank, size = dist.get_rank(), dist.get_world_size()
            crash_if_marked(crash_dir, rank, state.step)
            inputs, targets = batch_for(state.step)
            optimizer.zero_grad()
            shard = slice(rank * BATCH // size, (rank + 1) * BATCH // size)
            loss = torch.nn.functional.mse_loss(model(inputs[shard]), targets[shard])
            loss.backward()  # DDP averages the gradients over the current group
            optimizer.step()
            scheduler.step()
            state.step += 1
            check_replicas_agree(model, optimizer, state.step)
            send(
                {
                    "event": "step",
                    "step": state.step,
                    "size": size,
                    "rank": rank,
                    "lr": optimizer.param_groups[0]["lr"],
                    "epoch": scheduler.last_epoch,
                }
            )
            state.commit()
        return {name: p.detach().clone() for name, p in model.module.named_parameters()}

    result: dict[str, Any] = loop(state)
    return result


def reference_weights(steps: int, sizes: Callable[[int], int], base_lr: float = 0.05) -> dict[str, Any]:
    """The same training in one process: a full-batch mean gradient equals DDP's average of equal shards."""
    import torch

    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=base_lr, momentum=0.9)
    for step in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = base_lr * sizes(step) * 0.5 ** (step // 4)
        inputs, targets = batch_for(step)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(inputs), targets).backward()
        optimizer.step()
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def at(step: int, size: int) -> Callable[[dict[str, Any]], bool]:
    return lambda m: m["event"] == "step" and m["step"] >= step and m["size"] == size


def sizes_by_step(recorder: Recorder) -> dict[int, int]:
    """The world size that each surviving step ran at (the last run of a step that was rolled back and redone)."""
    sizes: dict[int, int] = {}
    for message in recorder.events("step"):
        sizes[message["step"] - 1] = message["size"]
    return sizes


def test_ddp_model_across_three_resets_matches_one_process(tmp_path: Path) -> None:
    """A model wrapped once in elastic.DistributedDataParallel before the loop trains through grow, grow, shrink."""
    import torch

    discovery = StaticHostDiscovery("host-1:1")
    stop_file = tmp_path / "stop"
    recorder = Recorder(
        discovery,
        [(at(4, 1), "host-1:1,host-2:1"), (at(10, 2), "host-1:1,host-2:1,host-3:1"), (at(16, 3), "host-1:1,host-3:1")],
        stop_file=stop_file,
        final_size=2,
    )
    with elastic_executor(discovery, min_workers=1, max_workers=3) as executor:
        executor.start()
        results = executor.run(train_ddp, args=[str(stop_file), None], callbacks=[recorder])
    assert recorder.plan == []
    assert recorder.events("diverged") == []
    sizes = sizes_by_step(recorder)
    steps = int(stop_file.read_text())
    assert sorted(sizes) == list(range(steps))
    assert [size for step, size in sorted(sizes.items()) if step == 0 or size != sizes[step - 1]] == [1, 2, 3, 2]
    inits = recorder.events("init")
    assert {m["size"] for m in inits} >= {1, 2, 3}, "newcomers see their world's rank and size before the loop"
    expected = reference_weights(steps, lambda step: sizes[step])
    assert len(results) == 2
    for weights in results:
        for name, value in expected.items():
            torch.testing.assert_close(weights[name], value, rtol=1e-5, atol=1e-6)


def test_newcomer_and_survivors_share_lr_and_weights_after_a_crash(crash_dir: Path) -> None:
    """Horovod's ``lr = base_lr * size`` reset callback: the replacement and the survivor agree at every step."""
    (crash_dir / "crash-1-6").touch()
    discovery = StaticHostDiscovery("host-1:2")
    stop_file = crash_dir / "stop"
    recorder = Recorder(discovery, [(at(6, 1), None)], stop_file=stop_file, final_size=2)
    with elastic_executor(discovery, min_workers=1, max_workers=2) as executor:
        executor.start()
        results = executor.run(train_ddp, args=[str(stop_file), str(crash_dir)], callbacks=[recorder])
    assert not (crash_dir / "crash-1-6").exists(), "the planned crash did not happen"
    assert recorder.events("diverged") == []
    steps = recorder.events("step")
    assert {m["size"] for m in steps} == {1, 2}
    back_to_two = [m for m in steps if m["size"] == 2 and m["step"] > 6]
    assert back_to_two, "the replacement never joined"
    for message in steps:  # the LR follows the world size and the schedule on every rank, newcomer included
        assert message["lr"] == pytest.approx(0.05 * message["size"] * 0.5 ** (message["epoch"] // 4))
    assert len(results) == 2


class Marker(dict[str, Any]):
    """A dict kept in TorchState by :class:`DieWhileSending`."""


class DieWhileSending(elastic.StateHandler):
    """Syncs a dict; as the sync source of a 3-worker world, exits the worker mid-sync once (a marker file)."""

    def save(self) -> None:
        self.saved = dict(self.value)

    def restore(self) -> None:
        self.value.clear()
        self.value.update(self.saved)

    def sync(self, source: int) -> None:
        import torch.distributed as dist

        marker = os.path.join(self.value["dir"], "die-while-sending")
        if dist.get_rank() == source and dist.get_world_size() == 3 and os.path.exists(marker):
            os.remove(marker)
            os._exit(1)  # the model went out already; this and the plain values never will
        self.value.update(elastic.broadcast_object(dict(self.value), source))


def train_counting(steps: str, folder: str) -> int:
    """Plain SGD steps with a custom-handled value; sends the step at every entry into the loop."""
    import torch
    import torch.distributed as dist

    elastic.set_handler_registry([(Marker, DieWhileSending), *elastic.get_handler_registry()])
    model = make_model()
    initial = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    state = elastic.TorchState(model, optimizer, marker=Marker(dir=folder), step=0)

    def report_committed_copy() -> None:  # runs at every reset, after any rollback, before the state moves
        committed = state._book.handlers["model"].saved
        send(
            {
                "event": "reset",
                "size": dist.get_world_size(),
                "commits": state.commit_count,
                "committed_is_initial": all(torch.equal(committed[k], v) for k, v in initial.items()),
                "live_is_committed": all(torch.equal(committed[k], v) for k, v in model.state_dict().items()),
            }
        )

    state.register_reset_callbacks([report_committed_copy])

    @elastic.run
    def loop(state: elastic.TorchState) -> int:
        send({"event": "entry", "step": state.step, "size": dist.get_world_size(), "rank": dist.get_rank()})
        while state.step < last_step(steps):
            inputs, targets = batch_for(state.step)
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(inputs), targets).backward()
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad /= dist.get_world_size()
            optimizer.step()
            state.step += 1
            check_replicas_agree(model, optimizer, state.step)
            send({"event": "step", "step": state.step, "size": dist.get_world_size(), "rank": dist.get_rank()})
            state.commit()
        return int(state.step)

    return loop(state)


def test_a_sync_source_killed_mid_sync_never_makes_a_newcomer_the_source(tmp_path: Path) -> None:
    """The newcomer is rank 0 (its host comes first); the source dies after sending the model and optimizer
    only. The commit count moves only after a whole sync, so the survivor, not the half-synced newcomer, is the
    next source; and the newcomer's committed copy is still its initial state, not the source's model beside its
    own values (it rolls back to it, and would start over from it)."""
    (tmp_path / "die-while-sending").touch()
    discovery = StaticHostDiscovery("host-1:1,host-2:1")
    stop_file = tmp_path / "stop"
    recorder = Recorder(
        discovery, [(at(6, 2), "host-3:1,host-1:1,host-2:1"), (at(8, 2), None)], stop_file=stop_file, final_size=3
    )
    with elastic_executor(discovery, min_workers=1, max_workers=3) as executor:
        executor.start()
        results = executor.run(train_counting, args=[str(stop_file), str(tmp_path)], callbacks=[recorder])
    assert not (tmp_path / "die-while-sending").exists(), "the source never died mid-sync"
    assert recorder.events("diverged") == []
    entries = recorder.events("entry")
    assert entries[0]["step"] == 0
    assert all(m["step"] >= 6 for m in entries[2:]), f"a reset went back to an older state: {entries}"
    assert results == [int(stop_file.read_text())] * 3
    resets = recorder.events("reset")
    # A newcomer's resets: the one whose sync failed, then the next, which shows what the failure left.
    newcomers = [m for m in resets if m["commits"] == 0]
    assert len(newcomers) >= 2, f"the newcomer never reset again after the failed sync: {resets}"
    assert all(m["committed_is_initial"] and m["live_is_committed"] for m in newcomers), resets
    survivors = [m for m in resets if m["commits"] > 0]
    assert all(m["live_is_committed"] for m in survivors), "a survivor's reset did not start from its commit"


def train_on_samples(epochs: str, dataset_size: int, batch_size: int) -> int:
    """An ElasticSampler in TorchState; every step sends the sample indices each rank trained on."""
    import torch
    import torch.distributed as dist

    init_process_group()
    dataset = torch.utils.data.TensorDataset(torch.arange(dataset_size))
    sampler = elastic.ElasticSampler(dataset, shuffle=True, seed=7)
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, sampler=sampler)
    model = elastic.DistributedDataParallel(torch.nn.Linear(1, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    state = elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, step=0)

    @elastic.run
    def loop(state: elastic.TorchState) -> int:
        while state.epoch < last_step(epochs):
            sampler.set_epoch(state.epoch)  # at the top, as with DistributedSampler: a resumed epoch keeps going
            for (indices,) in loader:
                optimizer.zero_grad()
                model(indices.float().unsqueeze(1)).sum().backward()
                optimizer.step()
                sampler.record_batch(0, len(indices))
                state.step += 1
                # Every rank reports the whole world's batch: a rank stopped right after a step it trained may
                # never get its own message out, and one message per step is then enough.
                everyone = [torch.empty_like(indices) for _ in range(dist.get_world_size())]
                dist.all_gather(everyone, indices)
                send(
                    {
                        "event": "step",
                        "step": state.step,
                        "epoch": state.epoch,
                        "size": dist.get_world_size(),
                        "world": os.environ["MASTER_PORT"],
                        "indices": torch.cat(everyone).tolist(),
                    }
                )
                state.commit()
            state.epoch += 1
        return int(state.step)

    return loop(state)


def test_elastic_sampler_trains_every_sample_once_across_shrink_and_grow(tmp_path: Path) -> None:
    dataset_size, batch_size = 101, 4
    discovery = StaticHostDiscovery("host-1:2")
    stop_file = tmp_path / "stop"
    recorder = Recorder(
        discovery,
        [(at(8, 2), "host-1:1"), (at(14, 1), "host-1:1,host-2:2")],
        stop_file=stop_file,
        final_size=3,
        stop_at=lambda m: int(m["epoch"]) + 2,  # one whole epoch at the final size
    )
    with elastic_executor(discovery, min_workers=1, max_workers=3) as executor:
        executor.start()
        executor.run(train_on_samples, args=[str(stop_file), dataset_size, batch_size], callbacks=[recorder])
    # A step that was rolled back and redone counts once: its last run, in whatever world ran it.
    runs: dict[int, dict[str, list[dict[str, Any]]]] = {}
    for message in recorder.events("step"):
        runs.setdefault(message["step"], {}).setdefault(message["world"], []).append(message)
    surviving = [list(by_world.values())[-1] for _, by_world in sorted(runs.items())]
    assert {ranks[0]["size"] for ranks in surviving} == {1, 2, 3}, "the job never ran at every size"
    epochs: dict[int, list[int]] = {}
    splits: dict[int, set[str]] = {}
    for ranks in surviving:
        assert all(m["indices"] == ranks[0]["indices"] for m in ranks), f"step {ranks[0]['step']}: ranks disagree"
        message = ranks[0]
        epochs.setdefault(message["epoch"], []).extend(message["indices"])
        splits.setdefault(message["epoch"], set()).add(message["world"])
    assert sorted(epochs) == list(range(int(stop_file.read_text())))
    for epoch, trained in epochs.items():
        skipped = set(range(dataset_size)) - set(trained)
        assert not skipped, f"epoch {epoch} skipped {sorted(skipped)}"
        padding = len(trained) - dataset_size
        assert 0 <= padding <= 2 * len(splits[epoch]), f"epoch {epoch} repeated {padding} samples"


def train_with_a_rollback(
    crash_dir: str, commit_every: int = 3, check_every_step: bool = False, steps: int | str = 20
) -> list[int]:
    """ObjectState; commits at step 1 and every ``commit_every`` steps (checking hosts at every other step when
    asked); a rank raises where the test left a ``raise-<rank>-<step>`` file."""
    import torch
    import torch.distributed as dist

    state = elastic.ObjectState(step=0, local=-1)
    entries: list[int] = []

    @elastic.run
    def loop(state: elastic.ObjectState) -> list[int]:
        entries.append(int(state.step))
        send({"event": "entry", "step": state.step, "local": state.local, "rank": dist.get_rank()})
        state.local = dist.get_rank()  # differs per rank: a full sync evens it out, a skipped one doesn't
        while state.step < last_step(steps):
            total = torch.ones(1)
            dist.all_reduce(total)
            state.step += 1
            send({"event": "step", "step": state.step, "size": dist.get_world_size()})
            marker = os.path.join(crash_dir, f"raise-{dist.get_rank()}-{state.step}")
            if os.path.exists(marker):
                os.remove(marker)
                kind = Path(marker + ".kind").read_text()
                if kind == "internal":
                    raise elastic.InternalError("the training code asked for a rollback")
                raise elastic.HostsUpdatedInterrupt(skip_sync=kind == "skip-sync")
            if state.step == 1 or state.step % commit_every == 0:
                state.commit()
            elif check_every_step:
                state.check_host_updates()
        return entries

    return loop(state)


@pytest.mark.parametrize(
    ("kind", "ranks", "expected_entry", "synced"),
    [("internal", [0], 3, True), ("sync", [0], 5, True), ("skip-sync", [0, 1], 5, False), ("skip-sync", [0], 5, True)],
)
def test_training_code_can_force_a_reset(
    crash_dir: Path, kind: str, ranks: list[int], expected_entry: int, synced: bool
) -> None:
    """``InternalError`` rolls back to the last commit; ``HostsUpdatedInterrupt`` keeps the work since it. With
    ``skip_sync=True`` on every rank, each keeps its state as it was; raised on one rank only, the other sees a
    failed collective and rolls back, so the state is synced after all."""
    for rank in ranks:
        (crash_dir / f"raise-{rank}-5").touch()
        (crash_dir / f"raise-{rank}-5.kind").write_text(kind)
    discovery = StaticHostDiscovery("host-1:2")
    recorder = Recorder()
    with elastic_executor(discovery, min_workers=2, max_workers=2) as executor:
        executor.start()
        results = executor.run(train_with_a_rollback, args=[str(crash_dir)], callbacks=[recorder])
    assert results[0] == results[1] == [0, expected_entry]
    second = [m for m in recorder.events("entry") if m["step"] == expected_entry]
    locals_seen = sorted(m["local"] for m in second)
    assert locals_seen == ([0, 0] if synced else [0, 1]), f"after the reset each rank held local={locals_seen}"


def test_check_host_updates_keeps_work_done_since_the_last_commit(crash_dir: Path) -> None:
    """A new host between commits: the workers leave at the next check and go on from there, not from the commit."""
    discovery = StaticHostDiscovery("host-1:1")
    stop_file = crash_dir / "stop"
    recorder = Recorder(discovery, [(at(4, 1), "host-1:1,host-2:1")], stop_file=stop_file, final_size=2)
    with elastic_executor(discovery, min_workers=1, max_workers=2) as executor:
        executor.start()
        results = executor.run(
            train_with_a_rollback, args=[str(crash_dir), 1000, True, str(stop_file)], callbacks=[recorder]
        )
    survivor, newcomer = results
    assert len(survivor) == 2
    assert newcomer == [survivor[1]]
    assert survivor[1] >= 4, f"the survivor went back to its commit at step 1: {survivor}"
