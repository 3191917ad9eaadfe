"""Durable training checkpoints on fsspec URIs: async save and restore, atomic commit, garbage collection.

```python
from elastrain.durable import CheckpointStore

store = CheckpointStore("s3://bucket/run-1", num_to_keep=3, score_attribute="loss", score_order="min")
future = store.save_async("/tmp/ckpt", metrics={"loss": 0.1}, step=100)  # returns once staged
...
store.restore(local_dir="/tmp/restored")  # the latest committed checkpoint, verified
store.close()
```
"""

from elastrain.durable._private.arrow_client import ArrowSyncClient
from elastrain.durable._private.checkpoint import Checkpoint, FileEntry
from elastrain.durable._private.command_client import CommandSyncClient
from elastrain.durable._private.elastic import StatePersistence
from elastrain.durable._private.errors import (
    CheckpointCorruptedError,
    CheckpointNotFoundError,
    CommandFailedError,
    DurableError,
    FilesChangedError,
    StaleCheckpointError,
    StorageError,
    StorageTimeoutError,
)
from elastrain.durable._private.fsspec_client import FsspecSyncClient
from elastrain.durable._private.futures import CheckpointFuture
from elastrain.durable._private.sharded import ShardedStatePersistence
from elastrain.durable._private.store import CheckpointStore
from elastrain.durable._private.sync_client import SyncClient
from elastrain.durable._version import __version__

__all__ = [
    "CheckpointStore",
    "Checkpoint",
    "CheckpointFuture",
    "FileEntry",
    "SyncClient",
    "FsspecSyncClient",
    "ArrowSyncClient",
    "CommandSyncClient",
    "StatePersistence",
    "ShardedStatePersistence",
    "DurableError",
    "CheckpointNotFoundError",
    "CheckpointCorruptedError",
    "StaleCheckpointError",
    "FilesChangedError",
    "StorageError",
    "StorageTimeoutError",
    "CommandFailedError",
    "__version__",
]
