"""Test harness of the real-training ports, not part of the ports: scikit-learn's bundled digits in place of
MNIST (nothing downloaded), per-step records for the scenario's checks, and crash injection."""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.utils.data

from elastrain.executor import send

# The first TRAIN_SIZE of digits' 1797 images train, the other 600 test (MNIST's train=True/False): a test set
# that large keeps two runs' accuracies within about 0.01 of each other. Odd, so that 2 workers need padding.
TRAIN_SIZE = 1197
# Mean and standard deviation of the training pixels scaled to [0, 1] (MNIST's 0.1307 and 0.3081).
MEAN, STD = 0.3063, 0.3755


class DigitsDataset(torch.utils.data.Dataset[tuple[torch.Tensor, int, int]]):
    """(1x8x8 normalised float image, label, index); the index lets the scenario check which samples trained."""

    def __init__(self, train: bool) -> None:
        from sklearn.datasets import load_digits

        digits = load_digits()
        part = slice(0, TRAIN_SIZE) if train else slice(TRAIN_SIZE, None)
        images = torch.tensor(digits.images[part], dtype=torch.float32).unsqueeze(1) / 16.0
        self.images = (images - MEAN) / STD
        self.labels = [int(label) for label in digits.target[part]]

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int, int]:
        return self.images[index], self.labels[index], index


def add_harness_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--crash-dir",
        help="test harness: a file crash-<rank>-<epoch>-<batch> there makes that rank exit hard at that batch, once",
    )


def crash_point(crash_dir: str | None, epoch: int, batch: int) -> None:
    """Exit hard, as a worker whose process dies, when this rank's marker for this batch exists (removed first)."""
    if crash_dir is None:
        return
    marker = os.path.join(crash_dir, f"crash-{dist.get_rank()}-{epoch}-{batch}")
    if os.path.exists(marker):
        os.remove(marker)
        os._exit(1)


def record_step(state: Any, sampler: Any, index: torch.Tensor) -> None:
    """Tell the driver what this step trained and the parameters it left (after ``optimizer.step()``).

    ``done``: the samples of the epoch the world has trained after this step (the sampler's count); less this
    step's samples, it names the step whatever the world size, where ``state.batch`` restarts at 0 after a reset.
    """
    checksum = sum(float(p.detach().double().sum()) for p in state.model.parameters())
    send(
        {
            "epoch": int(state.epoch),
            "batch": int(state.batch),
            "done": int(sampler.processed_num),
            "rank": dist.get_rank(),
            "size": dist.get_world_size(),
            # Every group the job forms has its own store, hence its own port.
            "world": f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
            "indices": [int(i) for i in index],
            "lr": float(state.optimizer.param_groups[0]["lr"]),
            "checksum": checksum,
            "pid": os.getpid(),
            "time": time.time(),  # orders the worlds (the workers share one clock in the scenario)
        }
    )
