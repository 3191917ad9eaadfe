"""Worker-side API of elastic jobs (the counterpart of ``horovod.torch.elastic``).

```python
from elastrain.executor import elastic

state = elastic.TorchState(model=model, optimizer=optimizer, epoch=0)

@elastic.run
def train(state):
    while state.epoch < 10:
        ...                      # collectives through torch.distributed
        state.epoch += 1
        state.commit()           # keep a copy to roll back to; join new workers here

train(state)
```
"""

from elastrain.executor._private.elastic.driver import ElasticJobError
from elastrain.executor._private.elastic.runtime import HostsUpdatedInterrupt, check_host_updates, run
from elastrain.executor._private.elastic.state import ObjectState, State, TorchState

__all__ = [
    "run",
    "State",
    "ObjectState",
    "TorchState",
    "HostsUpdatedInterrupt",
    "check_host_updates",
    "ElasticJobError",
]
