"""Horovod 0.28.1's ``examples/ray/pytorch_ray_elastic.py``, ported to elastrain.

Only the changes of docs/migrating-from-horovod.md, plus what the test harness needs (marked "Test harness"):
scikit-learn's digits in place of MNIST (nothing to download; the Net's sizes fit 8x8 images), ``train_fn``
takes the parsed arguments instead of reading a global parsed at import (so the scenario can import this
module), per-step records, and crash injection at the top of the batch loop (where earlier versions of the
example raised from ``check_rank``: in elastrain an exception in training code ends the job, while a worker's
death is what recovery is for). Options that go: ``--fp16-allreduce`` and ``--use-adasum`` (no compression or
Adasum), ``--data-dir`` (nothing to download). Calls deprecated in torch 2 (``log_softmax`` without ``dim``,
``size_average``, ``torch.tensor(tensor)``) use their replacements.
"""

from __future__ import annotations

import argparse

import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
import torch.utils.data.distributed

# Test harness (not part of the port): data, per-step records, crash injection.
from digits_harness import DigitsDataset, add_harness_arguments, crash_point, record_step

from elastrain.executor import context, elastic, init_process_group

# Training settings
parser = argparse.ArgumentParser(description="PyTorch MNIST Example")
parser.add_argument(
    "--batch-size", type=int, default=64, metavar="N", help="input batch size for training (default: 64)"
)
parser.add_argument(
    "--test-batch-size", type=int, default=1000, metavar="N", help="input batch size for testing (default: 1000)"
)
parser.add_argument("--epochs", type=int, default=5, metavar="N", help="number of epochs to train (default: 10)")
parser.add_argument("--lr", type=float, default=0.01, metavar="LR", help="learning rate (default: 0.01)")
parser.add_argument("--momentum", type=float, default=0.5, metavar="M", help="SGD momentum (default: 0.5)")
parser.add_argument("--no-cuda", action="store_true", default=False, help="disables CUDA training")
parser.add_argument("--seed", type=int, default=42, metavar="S", help="random seed (default: 42)")
parser.add_argument(
    "--log-interval", type=int, default=10, metavar="N", help="how many batches to wait before logging training status"
)
parser.add_argument(
    "--num-batches-per-commit", type=int, default=1, help="number of batches per commit of the elastic state object"
)
# Ray cluster to join (Horovod's example always used "auto").
parser.add_argument("--address", default="auto", help="Ray cluster address (default: auto)")
parser.add_argument("--num-workers", type=int, default=2, help="most workers the job runs on (default: 2)")
add_harness_arguments(parser)


def metric_average(val: float, name: str) -> float:
    # float(): val may be a tensor, which torch.tensor() warns about copying.
    tensor = torch.tensor(float(val))
    # torch sums; hvd.allreduce averaged.
    dist.all_reduce(tensor)
    tensor /= dist.get_world_size()
    return tensor.item()


class Net(nn.Module):
    # Sized for digits' 8x8 images (MNIST's 28x28 took kernel 5 and 320 features): kernel 3 with padding 1
    # keeps 8x8, pooling makes it 4x4, then 2x2, so fc1 sees 20 * 2 * 2 = 80 features.
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 10, kernel_size=3, padding=1)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=3, padding=1)
        self.conv2_drop = nn.Dropout2d()
        self.fc1 = nn.Linear(80, 50)
        self.fc2 = nn.Linear(50, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))
        x = x.view(-1, 80)
        x = F.relu(self.fc1(x))
        x = F.dropout(x, training=self.training)
        x = self.fc2(x)
        return F.log_softmax(x, dim=1)


def train_fn(args: argparse.Namespace) -> float:
    """Runs on every worker; returns the test accuracy (test harness)."""
    # elastrain: join the job's current group (hvd.init()).
    init_process_group()
    torch.manual_seed(args.seed)
    args.cuda = not args.no_cuda and torch.cuda.is_available()

    if args.cuda:
        # Horovod: pin GPU to local rank.
        torch.cuda.set_device(context().local_rank)
        torch.cuda.manual_seed(args.seed)

    # Horovod: limit # of CPU threads to be used per worker.
    torch.set_num_threads(1)

    kwargs = {"num_workers": 1, "pin_memory": True} if args.cuda else {}
    train_dataset = DigitsDataset(train=True)
    # elastrain: ElasticSampler partitions the training data over the current world, and what is left of an
    # epoch over every new one.
    train_sampler = elastic.ElasticSampler(train_dataset)
    train_loader = torch.utils.data.DataLoader(
        train_dataset, batch_size=args.batch_size, sampler=train_sampler, **kwargs
    )

    test_dataset = DigitsDataset(train=False)
    # elastrain: partition the test data over the world that trained last (it may differ from this one).
    test_sampler = elastic.ElasticSampler(test_dataset, shuffle=False)
    test_loader = torch.utils.data.DataLoader(
        test_dataset, batch_size=args.test_batch_size, sampler=test_sampler, **kwargs
    )

    model = Net()

    lr_scaler = dist.get_world_size()

    if args.cuda:
        # Move model to GPU.
        model.cuda()

    # Horovod: scale learning rate by lr_scaler.
    optimizer = optim.SGD(model.parameters(), lr=args.lr * lr_scaler, momentum=args.momentum)

    @elastic.run
    def train(state: elastic.TorchState) -> None:
        # post synchronization event (worker added, worker removed) init ...
        for state.epoch in range(state.epoch, args.epochs + 1):  # noqa: B020 (resume from the state, as in Horovod)
            state.model.train()

            train_sampler.set_epoch(state.epoch)

            # Test harness: the dataset also yields each sample's index.
            for state.batch, (data, target, index) in enumerate(train_loader):
                # Test harness: this rank may die here (Horovod's check_rank raised here).
                crash_point(args.crash_dir, state.epoch, state.batch)
                if args.cuda:
                    data, target = data.cuda(), target.cuda()
                state.optimizer.zero_grad()
                output = state.model(data)
                loss = F.nll_loss(output, target)
                loss.backward()
                state.optimizer.step()
                # elastrain: count this step's samples, so that a reset resumes the epoch after them.
                train_sampler.record_batch(state.batch, args.batch_size)
                if state.batch % args.log_interval == 0:
                    # Horovod: use train_sampler to determine
                    # the number of examples in this worker's partition.
                    print(
                        f"Train Epoch: {state.epoch} [{state.batch * len(data)}/{len(train_sampler)} "
                        f"({100.0 * state.batch / len(train_loader):.0f}%)]\tLoss: {loss.item():.6f}"
                    )
                # Test harness: what this step trained and the parameters it left.
                record_step(state, train_sampler, index)
                if (state.batch + 1) % args.num_batches_per_commit == 0:
                    state.commit()
            state.batch = 0

    def test() -> float:
        model.eval()
        test_loss = 0.0
        test_accuracy = 0.0
        for data, target, _ in test_loader:
            if args.cuda:
                data, target = data.cuda(), target.cuda()
            output = model(data)
            # sum up batch loss
            test_loss += F.nll_loss(output, target, reduction="sum").item()
            # get the index of the max log-probability
            pred = output.data.max(1, keepdim=True)[1]
            test_accuracy += pred.eq(target.data.view_as(pred)).cpu().float().sum()

        # Horovod: use test_sampler to determine the number of examples in
        # this worker's partition.
        test_loss /= len(test_sampler)
        test_accuracy /= len(test_sampler)

        # Horovod: average metric values across workers.
        test_loss = metric_average(test_loss, "avg_loss")
        test_accuracy = metric_average(test_accuracy, "avg_accuracy")

        # Horovod: print output only on first rank.
        if dist.get_rank() == 0:
            print(f"\nTest set: Average loss: {test_loss:.4f}, Accuracy: {100.0 * test_accuracy:.2f}%\n")
        # Test harness: the accuracy is the worker's result.
        return test_accuracy

    # elastrain: DistributedDataParallel averages the gradients (hvd.DistributedOptimizer did) and follows
    # every new group; the optimizer stays a plain one.
    model = elastic.DistributedDataParallel(model)

    # adjust learning rate on reset
    def on_state_reset() -> None:
        for param_group in optimizer.param_groups:
            param_group["lr"] = args.lr * dist.get_world_size()

    state = elastic.TorchState(model, optimizer, train_sampler=train_sampler, epoch=1, batch=0)
    state.register_reset_callbacks([on_state_reset])
    train(state)
    return test()


if __name__ == "__main__":
    import ray

    from elastrain.executor import RayExecutor

    args = parser.parse_args()
    ray.init(address=args.address)
    settings = RayExecutor.create_settings(verbose=True)
    executor = RayExecutor(
        settings, min_workers=1, max_workers=args.num_workers, use_gpu=torch.cuda.is_available(), cpus_per_worker=2
    )
    executor.start()
    executor.run(train_fn, args=[args])
