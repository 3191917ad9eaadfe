"""``ElasticSampler``: splits what is left of an epoch over whatever world the job has now."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sized
from typing import Any

import torch
from torch.utils.data import Sampler


class ElasticSampler(Sampler[int]):
    """A distributed sampler that survives resets (Horovod 0.28.1's API).

    Every epoch is a permutation of the dataset (seeded by ``seed + epoch`` when ``shuffle``). The sampler counts
    the samples the whole world has trained on this epoch (``record_batch``); at every reset, given to
    ``TorchState``, its progress is synced across the new world and what is left of the epoch is split over the
    new ranks. Nothing is skipped; a sample repeats only as padding, so every rank gets the same number.

    - ``record_batch(batch_idx, batch_size)`` after each step (before ``commit()``);
    - ``set_epoch(epoch)`` when a new epoch starts. Horovod calls it at the end of the epoch with the next
      epoch's number; calling it again with the epoch it is in (say, at the top of a loop that a reset re-entered)
      keeps the progress, so both placements work.
    """

    def __init__(self, dataset: Sized, shuffle: bool = True, seed: int = 0) -> None:
        if not hasattr(dataset, "__len__"):
            raise TypeError(f"ElasticSampler needs a dataset with a length, got {type(dataset).__name__}.")
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_num = 0  # samples the whole world trained on this epoch (padding included)
        self.num_replicas = 1
        self.rank = 0
        self.remaining_indices: list[int] = []
        self.num_samples = 0
        self.total_size = 0
        self.reset()

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` from its first sample; the epoch it is already in keeps its progress."""
        if epoch != self.epoch:
            self.epoch = epoch
            self.processed_num = 0
        self.reset()

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """Count one step's samples on every rank: ``batch_size`` here, the same on each of the others."""
        self.processed_num += batch_size * self.num_replicas

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "processed_num": self.processed_num}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch = int(state["epoch"])
        self.processed_num = int(state["processed_num"])
        self.reset()

    def reset(self) -> None:
        """Take the current world's rank and size, and split the rest of the epoch over it."""
        self.num_replicas, self.rank = _world()
        order = list(range(len(self.dataset)))
        if self.shuffle:
            generator = torch.Generator()
            generator.manual_seed(self.seed + self.epoch)
            order = torch.randperm(len(order), generator=generator).tolist()
        self.remaining_indices = order[self.processed_num :]
        self.num_samples = math.ceil(len(self.remaining_indices) / self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas

    def __iter__(self) -> Iterator[int]:
        # The world may have changed since the last reset (a DataLoader iterates lazily): split for the current one.
        if _world() != (self.num_replicas, self.rank):
            self.reset()
        indices = list(self.remaining_indices)
        padding = self.total_size - len(indices)
        while padding > 0:  # pad with the head of the list (repeated when it is shorter than the padding)
            indices += indices[:padding]
            padding = self.total_size - len(indices)
        return iter(indices[self.rank : self.total_size : self.num_replicas])

    def __len__(self) -> int:
        return self.num_samples


def _world() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0
