"""Elastic state on its own: handlers restore in place, names never clash, bad input says what to change.

These run in the test process on a one-process gloo group (no Ray): saving and restoring need no peers, and a
sync with one rank exercises the same broadcasts.
"""

from __future__ import annotations

import datetime
import socket
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist

from elastrain.executor import elastic
from elastrain.executor._private.elastic.worker import runtime
from elastrain.executor._private.elastic.world import make_world


@pytest.fixture(scope="module")
def one_process_group() -> Iterator[None]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    store = dist.TCPStore("127.0.0.1", port, 1, is_master=True, timeout=datetime.timedelta(seconds=30))
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def training_objects() -> tuple[Any, Any, Any, Any, Any]:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    second = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    sampler = elastic.ElasticSampler(list(range(10)), shuffle=False)
    return model, optimizer, second, scheduler, sampler


def train_steps(model: Any, optimizers: list[Any], scheduler: Any, steps: int) -> None:
    for _ in range(steps):
        for optimizer in optimizers:
            optimizer.zero_grad()
        model(torch.ones(4, 3)).pow(2).sum().backward()
        for optimizer in optimizers:
            optimizer.step()
        scheduler.step()


def test_restore_rolls_back_in_place_and_keeps_the_objects_the_user_holds() -> None:
    model, optimizer, second, scheduler, sampler = training_objects()
    state = elastic.TorchState(model, optimizer, second=second, scheduler=scheduler, sampler=sampler, epoch=0)
    train_steps(model, [optimizer, second], scheduler, 3)
    sampler.record_batch(0, 4)
    state.epoch = 1
    state.save()
    committed = {k: v.clone() for k, v in model.state_dict().items()}
    committed_lr, committed_exp_avg = optimizer.param_groups[0]["lr"], optimizer.state[model.weight]["exp_avg"].clone()
    momentum = second.state[model.weight]["momentum_buffer"].clone()

    train_steps(model, [optimizer, second], scheduler, 4)
    sampler.record_batch(1, 4)
    state.epoch = 2
    state.restore()

    assert state.model is model
    assert state.optimizer is optimizer
    assert state.second is second
    assert state.scheduler is scheduler
    assert state.sampler is sampler
    for name, value in model.state_dict().items():
        assert torch.equal(value, committed[name])
    assert optimizer.param_groups[0]["lr"] == committed_lr
    assert torch.equal(optimizer.state[model.weight]["exp_avg"], committed_exp_avg)
    assert torch.equal(second.state[model.weight]["momentum_buffer"], momentum)
    assert scheduler.last_epoch == 3
    assert sampler.processed_num == 4
    assert len(sampler) == 6
    assert state.epoch == 1


def test_commit_copies_into_the_same_buffers() -> None:
    model, optimizer, *_ = training_objects()
    state = elastic.TorchState(model, optimizer)
    handler = state._book.handlers["model"]
    before = {k: v.data_ptr() for k, v in handler.saved.items()}
    model.weight.data.add_(1.0)
    state.save()
    assert {k: v.data_ptr() for k, v in handler.saved.items()} == before
    assert torch.equal(handler.saved["weight"], model.weight.detach())


def test_user_values_named_like_bookkeeping_are_theirs() -> None:
    state = elastic.TorchState(commits=0, step=3)  # Horovod's own tests pass commits=0
    assert state.commits == 0
    assert state.commit_count == 0
    state.commits = 7
    state.save()
    assert state.commit_count == 0
    assert state.commits == 7


@pytest.mark.parametrize("name", ["commit", "save", "sync", "commit_count", "_elastic"])
def test_values_that_would_shadow_the_state_api_are_refused(name: str) -> None:
    with pytest.raises(ValueError, match=f"'{name}'.*taken by the state's own methods; rename"):
        elastic.ObjectState(**{name: 1})


def test_registry_takes_handlers_for_your_own_types() -> None:
    class Counter:
        def __init__(self) -> None:
            self.count = 0

    class CounterHandler(elastic.StateHandler):
        def save(self) -> None:
            self.saved = self.value.count

        def restore(self) -> None:
            self.value.count = self.saved

        def sync(self, source: int) -> None:
            self.value.count = elastic.broadcast_object(self.value.count, source)

    original = elastic.get_handler_registry()
    elastic.set_handler_registry([(Counter, CounterHandler), *original])
    try:
        counter = Counter()
        state = elastic.TorchState(counter=counter)
        counter.count = 5
        state.restore()
        assert state.counter is counter
        assert counter.count == 0
    finally:
        elastic.set_handler_registry(original)
    with pytest.raises(TypeError, match=r"\(type, StateHandler subclass\) pairs"):
        elastic.set_handler_registry([(Counter, object)])  # type: ignore[list-item]


def test_elastic_ddp_needs_a_group() -> None:
    assert not dist.is_initialized()
    with pytest.raises(RuntimeError, match=r"call elastrain.executor.init_process_group\(\) first"):
        elastic.DistributedDataParallel(torch.nn.Linear(2, 1))


def test_sync_on_one_rank_keeps_everything(one_process_group: None) -> None:
    model, optimizer, second, scheduler, sampler = training_objects()
    state = elastic.TorchState(model, optimizer, second=second, scheduler=scheduler, sampler=sampler, step=2)
    train_steps(model, [optimizer, second], scheduler, 2)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    runtime.install(runtime.Runtime(None, "w0", None))  # type: ignore[arg-type]
    try:
        state._synchronize()
    finally:
        runtime.install(None)
    assert all(torch.equal(v, weights[k]) for k, v in model.state_dict().items())
    assert state.step == 2
    assert state.commit_count == 0


def committed_tensors(state: Any) -> list[torch.Tensor]:
    saved = [state._book.handlers[name].saved for name in ("model", "optimizer")]
    tensors = list(saved[0].values()) + [t for entry in saved[1]["state"].values() for t in entry.values()]
    return [t for t in tensors if isinstance(t, torch.Tensor)]


def committed_versions(state: Any) -> list[int]:
    """How often each committed tensor was written (a copy into it counts)."""
    return [t._version for t in committed_tensors(state)]


def synchronized(state: Any) -> None:
    runtime.install(runtime.Runtime(None, "w0", None))  # type: ignore[arg-type]
    try:
        state._synchronize()
    finally:
        runtime.install(None)


def adam_steps(model: Any, optimizer: Any, steps: int) -> None:
    train_steps(model, [optimizer], torch.optim.lr_scheduler.StepLR(optimizer, 1), steps)


def third_commit_after(steps: int) -> tuple[Any, Any, Any]:
    """A model and its Adam trained ``steps`` steps, in a TorchState that saved them as its third commit."""
    model, optimizer, *_ = training_objects()
    state = elastic.TorchState(model, optimizer, step=0)
    adam_steps(model, optimizer, steps)
    state.save()
    state._book.commits = 3
    return model, optimizer, state


def test_a_sync_at_the_last_commit_leaves_the_committed_copy_alone(one_process_group: None) -> None:
    """A survivor whose reset came from its commit, or after a rollback, already holds what the source sends."""
    model, optimizer, state = third_commit_after(2)
    state._book.commit_interrupt = interrupt = elastic.HostsUpdatedInterrupt()
    state._interrupted(interrupt)  # a reset that commit() raised
    versions = committed_versions(state)
    synchronized(state)
    assert committed_versions(state) == versions
    assert state.commit_count == 3
    assert not state._book.at_commit  # the training code runs next
    adam_steps(model, optimizer, 1)
    state._roll_back()
    assert state._book.at_commit
    synchronized(state)
    assert committed_versions(state) == versions


def test_only_a_reset_that_commit_raised_counts_as_at_the_commit() -> None:
    state = elastic.ObjectState(step=0)
    from_commit, from_training_code = elastic.HostsUpdatedInterrupt(), elastic.HostsUpdatedInterrupt()
    state._book.commit_interrupt = from_commit
    state._interrupted(from_training_code)  # the training code caught commit()'s interrupt, trained on, raised
    assert not state._book.at_commit
    state._book.commit_interrupt = from_commit
    state._interrupted(from_commit)
    assert state._book.at_commit


def test_a_committed_tensor_a_reset_reshaped_is_copied_again(one_process_group: None) -> None:
    model, _, state = third_commit_after(0)
    state._book.at_commit = True
    model.half()  # what a reset callback might do: every committed tensor is float32, the live ones float16
    synchronized(state)
    saved = state._book.handlers["model"].saved
    assert all(saved[k].dtype == torch.float16 and torch.equal(saved[k], v) for k, v in model.state_dict().items())


def test_a_sync_with_work_since_the_commit_commits_what_it_brought(one_process_group: None) -> None:
    """Interrupted between commits (check_host_updates in the training code), the state synced is committed."""
    model, optimizer, state = third_commit_after(1)
    adam_steps(model, optimizer, 2)  # not committed
    before = committed_tensors(state)
    versions = committed_versions(state)
    synchronized(state)
    # A fresh committed copy, swapped in whole: the old buffers were never written (a sync that failed
    # partway would have left them as they were).
    assert [t._version for t in before] == versions
    assert not {id(t) for t in committed_tensors(state)} & {id(t) for t in before}
    saved = state._book.handlers["model"].saved
    assert all(torch.equal(saved[k], v) for k, v in model.state_dict().items())
    state.restore()  # rolls back to what the sync committed, not to the commit before it
    assert all(torch.equal(saved[k], v) for k, v in model.state_dict().items())


def test_objects_travel_without_numpy_in_the_way(one_process_group: None) -> None:
    value = {"nested": [1, 2.5, "three"], "tensor_free": True}
    assert elastic.broadcast_object(value, 0) == value
    tensors = [torch.arange(5.0), torch.ones(2, 2, dtype=torch.float64), torch.zeros(0)]
    elastic.broadcast_tensors(tensors, 0)
    assert torch.equal(tensors[0], torch.arange(5.0))


def test_torch_ddp_in_state_points_at_the_elastic_wrapper(one_process_group: None) -> None:
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2))
    with pytest.raises(TypeError, match=r"elastrain\.executor\.elastic\.DistributedDataParallel"):
        elastic.TorchState(model)


def test_elastic_ddp_outside_a_job_is_torch_ddp_on_the_default_group(one_process_group: None) -> None:
    torch.manual_seed(0)
    inner = torch.nn.Linear(2, 1)
    model = elastic.DistributedDataParallel(inner, find_unused_parameters=False)
    assert list(model.state_dict()) == ["module.weight", "module.bias"]
    model(torch.ones(3, 2)).sum().backward()
    assert inner.weight.grad is not None
    assert torch.equal(inner.weight.grad, torch.full((1, 2), 3.0))
    with pytest.raises(ValueError, match="drop process_group="):
        elastic.DistributedDataParallel(inner, process_group=dist.group.WORLD)


def test_sampler_resumes_an_epoch_and_pads_only_to_an_even_split() -> None:
    sampler = elastic.ElasticSampler(list(range(10)), shuffle=True, seed=3)
    first_epoch = list(sampler)
    assert sorted(first_epoch) == list(range(10))
    sampler.record_batch(0, 4)
    sampler.set_epoch(0)  # the epoch it is in: progress kept
    assert list(sampler) == first_epoch[4:]
    restored = elastic.ElasticSampler(list(range(10)), shuffle=True, seed=3)
    restored.load_state_dict(sampler.state_dict())
    assert list(restored) == first_epoch[4:]
    sampler.set_epoch(1)
    second_epoch = list(sampler)
    assert sorted(second_epoch) == list(range(10))
    assert second_epoch != first_epoch
    with pytest.raises(TypeError, match="needs a dataset with a length"):
        elastic.ElasticSampler(iter(range(3)))  # type: ignore[arg-type]


class _Candidate:
    def __init__(self, worker_id: str) -> None:
        self.worker_id, self.host_id, self.joined = worker_id, "host-1", True


def test_ranks_within_a_host_follow_the_workers_numbers() -> None:
    world = make_world(1, [_Candidate(w) for w in ("w10", "w2", "w1")], ["host-1"])
    assert [m.worker_id for m in world.members] == ["w1", "w2", "w10"]


def test_a_reset_runs_the_reset_hook_then_the_callbacks_in_order() -> None:
    calls: list[str] = []

    class Tracked(elastic.ObjectState):
        def reset(self) -> None:
            calls.append("reset")

    state = Tracked(step=0)
    state.register_reset_callbacks([lambda: calls.append("first"), lambda: calls.append("second")])
    state.on_reset()
    assert calls == ["reset", "first", "second"]
    with pytest.raises(TypeError, match="takes a list of functions"):
        state.register_reset_callbacks([1])  # type: ignore[list-item]


def test_a_snapshot_stays_as_it_was_when_training_commits_again() -> None:
    """Persistence pickles snapshots in the background while training goes on committing into its buffers."""
    model, optimizer, *_ = training_objects()
    state = elastic.TorchState(model, optimizer, step=1)
    snapshot = state.snapshot()
    before = snapshot["handlers"]["model"]["weight"].clone()
    model.weight.data.add_(1.0)
    state.save()
    assert torch.equal(snapshot["handlers"]["model"]["weight"], before)
    restored = elastic.TorchState(training_objects()[0], step=0)
    restored.load_snapshot({"handlers": {"model": snapshot["handlers"]["model"]}, "values": {"step": 1}}, 3)
    assert torch.equal(restored.model.weight.detach(), before)
    assert restored.step == 1
    assert restored.commit_count == 3


def test_snapshots_persisted_before_handlers_still_load() -> None:
    model, optimizer, *_ = training_objects()
    old = ({k: v.clone() + 1 for k, v in model.state_dict().items()}, None, {"step": 7})
    state = elastic.TorchState(model, optimizer, step=0)
    state.load_snapshot(old, 4)
    assert torch.equal(model.weight.detach(), old[0]["weight"])
    assert state.step == 7
    assert state.commit_count == 4


def _huge_page_bytes_under(tensor: torch.Tensor) -> int:
    """AnonHugePages of the mapping that holds the middle of ``tensor``, from /proc/self/smaps (advising splits
    the allocation's mapping: its first, partial page stays apart)."""
    address, found, inside = tensor.data_ptr() + tensor.nbytes // 2, 0, False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split()[0]
            if "-" in head and all(c in "0123456789abcdef-" for c in head):
                low, high = (int(part, 16) for part in head.split("-"))
                inside = low <= address < high
            elif inside and head == "AnonHugePages:":
                found = int(line.split()[1]) * 1024
    return found


def _thp_mode() -> str:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as setting:
            return setting.read().split("[", 1)[1].split("]", 1)[0]
    except (OSError, IndexError):
        return "never"


def test_a_first_commit_of_a_big_model_faults_in_huge_pages() -> None:
    """A newcomer's committed copy is fresh memory: where the kernel allows huge pages, it gets them."""
    model = torch.nn.Linear(2048, 2048)  # 16 MiB of weights
    state = elastic.TorchState(model)  # takes the first committed copy
    saved = state._book.handlers["model"].saved["weight"]
    assert torch.equal(saved, model.weight.detach())
    assert saved.data_ptr() != model.weight.data_ptr()
    if _thp_mode() != "never":
        with open("/proc/vmstat") as vmstat:
            fallbacks = {k: int(v) for k, v in (line.split() for line in vmstat)}.get("thp_fault_fallback", 0)
        # The kernel may have had no free huge page at hand (it then counts a fallback), never silently none.
        assert _huge_page_bytes_under(saved) > 0 or fallbacks > 0
    state.save()  # later commits copy into the same buffer
    assert state._book.handlers["model"].saved["weight"].data_ptr() == saved.data_ptr()


def test_committed_copies_of_unusual_tensors_match_the_originals() -> None:
    """Sparse, strided and small tensors are copied as before (only big dense ones are advised)."""
    from elastrain.executor._private.elastic.worker.handlers import copy_into

    big_transposed = torch.randn(1024, 4096).t()  # 16 MiB, not contiguous
    values = {
        "sparse": torch.eye(4).to_sparse(),
        "half": torch.randn(2048, 2048, dtype=torch.float16),  # 8 MiB: advised
        "transposed": big_transposed,
        "small": torch.arange(3),
    }
    copies = copy_into(None, values)
    assert torch.equal(copies["sparse"].to_dense(), values["sparse"].to_dense())
    assert torch.equal(copies["half"], values["half"])
    assert torch.equal(copies["transposed"], big_transposed)
    assert copies["transposed"].stride() == big_transposed.stride()
    assert torch.equal(copies["small"], values["small"])
    assert all(copies[name].data_ptr() != values[name].data_ptr() for name in ("half", "transposed", "small"))
