"""What every worker of the demo runs: a small CNN learns scikit-learn's bundled digits (nothing is downloaded)
with torch's DistributedDataParallel and an elastic sampler, so a crash or a newcomer never skips or repeats
part of an epoch. It is plain elastic PyTorch code, as docs/elastic.md describes it, plus the demo's own
planned crash and its reports to the driver.
"""

from __future__ import annotations

import os
import time
from typing import Any

# The first TRAIN_SIZE of digits' 1797 8x8 images train; the other 597 are the held-out test set.
TRAIN_SIZE = 1200
# Mean and standard deviation of the training pixels scaled to [0, 1].
MEAN, STD = 0.3063, 0.3755
BATCH = 32  # per worker
LR = 0.05  # per worker: scaled by the world size, as Horovod's examples do
REPORT_EVERY = 5  # steps between two reports to the driver
# A real step takes longer than this tiny model's few milliseconds; pacing keeps the run watchable and leaves
# time for a replacement worker to start while the survivor trains alone.
PACE_S = 0.06


def digits(train: bool) -> Any:
    """Digits as a ``TensorDataset`` of (1x8x8 normalised image, label)."""
    import torch
    from sklearn.datasets import load_digits

    data = load_digits()
    part = slice(0, TRAIN_SIZE) if train else slice(TRAIN_SIZE, None)
    images = torch.tensor(data.images[part], dtype=torch.float32).unsqueeze(1) / 16.0
    return torch.utils.data.TensorDataset((images - MEAN) / STD, torch.tensor(data.target[part]))


def small_cnn() -> Any:
    """Two 3x3 convolutions and a linear layer: about 6,000 parameters, 8x8 -> 4x4 -> 2x2 -> 10 classes."""
    from torch import nn

    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(32 * 2 * 2, 10),
    )


def train(epochs: int, persistence: Any, crash_step: int) -> dict[str, float]:
    """Runs on every worker of the elastic job; returns the test accuracy and loss, and how far it trained.

    At ``crash_step`` the worker of rank 1 exits hard, once, as if the OOM killer had taken its process.
    """
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from elastrain.executor import elastic, init_process_group, send

    init_process_group()  # rank and world size from here on, as after hvd.init()
    torch.manual_seed(0)  # every worker starts from the same weights
    torch.set_num_threads(1)  # one CPU per worker
    train_set, test_set = digits(train=True), digits(train=False)
    sampler = elastic.ElasticSampler(train_set, seed=0)  # the rest of each epoch, split over the current world
    loader = torch.utils.data.DataLoader(train_set, batch_size=BATCH, sampler=sampler)
    model = elastic.DistributedDataParallel(small_cnn())  # torch's DDP, re-bound to every new group
    optimizer = torch.optim.SGD(model.parameters(), lr=LR * dist.get_world_size(), momentum=0.9)
    state = elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, step=0, resets=0)
    state.persist_with(persistence)  # every 10th commit goes to durable storage in the background

    def on_reset() -> None:  # on every member of each new world, before the state is synced
        state.resets += 1
        for group in optimizer.param_groups:
            group["lr"] = LR * dist.get_world_size()

    state.register_reset_callbacks([on_reset])

    @elastic.run
    def loop(state: elastic.TorchState) -> dict[str, float]:
        rank, size = dist.get_rank(), dist.get_world_size()
        window = Window()

        def report() -> None:  # metrics for the driver's callbacks (and the run's state)
            done = state.epoch + min(1.0, sampler.processed_num / len(train_set))
            # Numbers are charted as the run's metrics; the bookkeeping the driver's summary needs goes in a
            # nested dict, which run state leaves out.
            taken = window.take()
            world = {"size": size, "resets": state.resets, "time": taken.pop("time")}
            send({"step": state.step, "epoch": done, **taken, "world": world})

        reported = False  # report the first step of every world: the driver times recoveries from it
        while state.epoch < epochs:
            sampler.set_epoch(state.epoch)  # keeps a resumed epoch's progress
            for inputs, targets in loader:
                optimizer.zero_grad()
                outputs = model(inputs)
                loss = F.cross_entropy(outputs, targets)
                loss.backward()  # DDP averages the gradients over the world
                optimizer.step()
                sampler.record_batch(0, len(inputs))
                state.step += 1
                window.add(float(loss), int((outputs.argmax(1) == targets).sum()), len(targets))
                state.commit()  # a copy to roll back to; newcomers join here
                if rank == 0 and (state.step % REPORT_EVERY == 0 or not reported):
                    report()
                    reported = True
                time.sleep(PACE_S)
                if rank == 1 and state.step == crash_step and state.resets == 0:
                    os._exit(1)  # the planned crash: no clean-up, no goodbye, as if the process was killed
            state.epoch += 1
        if rank == 0 and window.batches:
            report()  # the last steps
        return {"step": float(state.step), **evaluate(model, test_set, rank, size)}

    result: dict[str, float] = loop(state)
    return result


class Window:
    """Training loss and accuracy over the batches since the last report."""

    def __init__(self) -> None:
        self.loss, self.batches, self.correct, self.seen = 0.0, 0, 0, 0

    def add(self, loss: float, correct: int, seen: int) -> None:
        self.loss, self.batches = self.loss + loss, self.batches + 1
        self.correct, self.seen = self.correct + correct, self.seen + seen

    def take(self) -> dict[str, float]:
        """The window's means, and when it was taken (the driver times recoveries from it); then a new window."""
        taken = {"loss": self.loss / max(1, self.batches), "accuracy": self.correct / max(1, self.seen)}
        self.loss, self.batches, self.correct, self.seen = 0.0, 0, 0, 0
        return {**taken, "time": time.time()}


def evaluate(model: Any, test_set: Any, rank: int, size: int) -> dict[str, float]:
    """Accuracy and loss on the held-out digits, each worker scoring its share, summed over the world."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    model.eval()
    images, labels = test_set.tensors
    mine = slice(rank, None, size)
    with torch.no_grad():
        outputs = model.module(images[mine])  # the plain model: no gradients to average here
        totals = torch.tensor(
            [
                float((outputs.argmax(1) == labels[mine]).sum()),
                float(F.cross_entropy(outputs, labels[mine], reduction="sum")),
                float(len(labels[mine])),
            ]
        )
    dist.all_reduce(totals)
    correct, loss, count = totals.tolist()
    return {"test_accuracy": correct / count, "test_loss": loss / count, "test_size": count}
