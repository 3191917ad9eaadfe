"""Worker-side API of elastic jobs (the counterpart of ``horovod.torch.elastic``).

```python
from elastrain.executor import elastic, init_process_group

init_process_group()                               # like hvd.init(): rank and size from here on
model = elastic.DistributedDataParallel(model)     # re-bound to every new group
sampler = elastic.ElasticSampler(dataset)          # the rest of an epoch, split over the current world
state = elastic.TorchState(model, optimizer, sampler=sampler, epoch=0)

@elastic.run
def train(state):
    for state.epoch in range(state.epoch, 10):
        for batch in loader:
            ...                                    # forward, backward, optimizer.step()
            sampler.record_batch(0, batch_size)
            state.commit()                         # a copy to roll back to; new workers join here
        sampler.set_epoch(state.epoch + 1)

train(state)
```

``ElasticSampler`` and ``DistributedDataParallel`` import torch when first used; the rest imports neither torch
nor Ray.
"""

from typing import TYPE_CHECKING, Any

from elastrain.executor._private.elastic.worker.collectives import broadcast_object, broadcast_tensors
from elastrain.executor._private.elastic.worker.handlers import (
    ModuleHandler,
    OptimizerHandler,
    SamplerHandler,
    SchedulerHandler,
    StateDictHandler,
    StateHandler,
    get_handler_registry,
    set_handler_registry,
)
from elastrain.executor._private.elastic.worker.reset import ResetPlan, SyncRole
from elastrain.executor._private.elastic.worker.runtime import (
    HostsUpdatedInterrupt,
    InternalError,
    check_host_updates,
    run,
)
from elastrain.executor._private.elastic.worker.sharded_state import ShardedTorchState
from elastrain.executor._private.elastic.worker.state import ObjectState, State, TorchState
from elastrain.executor._private.errors import ElasticJobError

if TYPE_CHECKING:
    from elastrain.executor._private.elastic.worker.ddp import DistributedDataParallel
    from elastrain.executor._private.elastic.worker.sampler import ElasticSampler

#: Horovod's name for :class:`InternalError`, so ``except hvd.HorovodInternalError`` ports unchanged.
HorovodInternalError = InternalError

__all__ = [
    "run",
    "State",
    "ObjectState",
    "TorchState",
    "ShardedTorchState",
    "ElasticSampler",
    "DistributedDataParallel",
    "HostsUpdatedInterrupt",
    "InternalError",
    "HorovodInternalError",
    "check_host_updates",
    "ElasticJobError",
    # custom state types
    "StateHandler",
    "ModuleHandler",
    "OptimizerHandler",
    "SchedulerHandler",
    "SamplerHandler",
    "StateDictHandler",
    "ResetPlan",
    "SyncRole",
    "get_handler_registry",
    "set_handler_registry",
    "broadcast_object",
    "broadcast_tensors",
]


def __getattr__(name: str) -> Any:
    # These two subclass torch classes: importing them imports torch, which the driver may not need.
    if name == "ElasticSampler":
        from elastrain.executor._private.elastic.worker.sampler import ElasticSampler

        return ElasticSampler
    if name == "DistributedDataParallel":
        from elastrain.executor._private.elastic.worker.ddp import DistributedDataParallel

        return DistributedDataParallel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
