"""Which checkpoints restores are reading, so that garbage collection leaves them alone.

Within a process a counter says it; across processes and machines a restore leaves a lease on the storage,
``_readers/<checkpoint>.<lease id>.json`` holding when it expires, and removes it when done. A reader that dies
leaves a lease that expires by itself.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Generator
from typing import Any

from elastrain.durable._private.location import Location
from elastrain.durable._private.sync_client import SyncClient

logger = logging.getLogger("elastrain.durable")
READERS_DIR = "_readers"

_in_process: collections.Counter[tuple[str, str]] = collections.Counter()
_in_process_lock = threading.Lock()


@dataclasses.dataclass(frozen=True)
class Lease:
    held: bool
    problem: str  # why it could not be written


class Readers:
    """Marks and finds checkpoints being read under one store root."""

    def __init__(
        self, location: Location, client: SyncClient, retry: Callable[..., Any], secrets: Callable[[str], str]
    ):
        self.location = location
        self.client = client
        self.retry = retry
        self.redact = secrets

    @contextlib.contextmanager
    def reading(self, name: str, lease_s: float) -> Generator[Lease, None, None]:
        key = (self.location.root, name)
        with _in_process_lock:
            _in_process[key] += 1
        uri = self.location.join(READERS_DIR, f"{name}.{uuid.uuid4().hex}.json")
        lease = self._write_lease(uri, lease_s)
        try:
            yield lease
        finally:
            if lease.held:
                self._remove(uri)
            with _in_process_lock:
                _in_process[key] -= 1
                if _in_process[key] <= 0:
                    del _in_process[key]

    def busy(self) -> set[str]:
        """Names being read here or holding an unexpired lease; expired leases are removed on the way."""
        with _in_process_lock:
            names = {name for root, name in _in_process if root == self.location.root}
        now = time.time()
        for lease in self._names(self.location.join(READERS_DIR)):
            name, _, rest = lease.partition(".")
            uri = self.location.join(READERS_DIR, lease)
            expires_at = self._expiry(uri)
            if expires_at is None:
                continue  # its reader just finished
            if expires_at > now and rest.endswith(".json"):
                names.add(name)
            else:
                self._remove(uri)  # expired: its reader died
        return names

    def _write_lease(self, uri: str, lease_s: float) -> Lease:
        document = json.dumps({"expires_at": time.time() + lease_s}).encode()
        try:
            self.retry(lambda left: self.client.write_bytes(uri, document, timeout_s=left), "writing a reader lease")
        except Exception as error:  # read-only credentials (evaluation jobs): restore anyway, verified
            problem = self.redact(f"{type(error).__name__}: {error}")
            logger.warning(
                "Restoring without a reader lease (%s): collection by a writer may take the checkpoint meanwhile; "
                "the restore then fails with CheckpointNotFoundError, or moves on to the latest one.",
                problem,
            )
            return Lease(False, problem)
        return Lease(True, "")

    def _expiry(self, uri: str) -> float | None:
        try:
            data = self.retry(lambda left: self.client.read_bytes(uri, timeout_s=left), "reading a reader lease")
            return float(json.loads(data)["expires_at"])
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError):
            return 0.0  # unreadable: treat as expired

    def _names(self, uri: str) -> list[str]:
        names: list[str] = self.retry(lambda left: self.client.list_names(uri, timeout_s=left), "listing reader leases")
        return names

    def _remove(self, uri: str) -> None:
        try:
            self.retry(lambda left: self.client.delete_file(uri, timeout_s=left), "removing a reader lease")
        except Exception as error:  # an expired lease left behind is removed by the next collection
            logger.warning(
                "Could not remove a reader lease under %s (%s).", self.location.display, self.redact(str(error))
            )
