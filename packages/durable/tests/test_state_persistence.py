"""StatePersistence without Ray: a failed background save is tried again, and a newer copy supersedes it."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from elastrain.durable import CommandSyncClient, StatePersistence

# Copies like `aws s3 sync`, but fails while the file given as "$2" exists: a storage server that is down.
SYNC_UNLESS_DOWN = (
    'sh -c \'if [ -e "$2" ]; then echo "server down" >&2; exit 1; fi; '
    'mkdir -p "$1" && if [ -d "$0" ]; then cp -R "$0"/. "$1"; fi\' {source} {target} '
)
SYNC = 'sh -c \'mkdir -p "$1" && if [ -d "$0" ]; then cp -R "$0"/. "$1"; fi\' {source} {target}'


class CommittedState:
    """The two things StatePersistence asks of an elastic state."""

    def __init__(self, commits: int) -> None:
        self.commits = commits

    def snapshot(self) -> dict[str, Any]:
        return {"commits": self.commits}


def persistence(tmp_path: Path, down: Path) -> StatePersistence:
    client = CommandSyncClient(sync_up=SYNC_UNLESS_DOWN + str(down), sync_down=SYNC, delete="rm -rf {target}")
    return StatePersistence(tmp_path / "store", every=1, sync_client=client)


def test_a_copy_that_failed_is_saved_once_storage_is_back(tmp_path: Path) -> None:
    down = tmp_path / "server-down"
    down.touch()
    persisting = persistence(tmp_path, down)
    persisting.committed(CommittedState(commits=7))
    # Longer than the store's own retries (about 1.5 s): only a later try can succeed.
    threading.Timer(2.5, down.unlink).start()
    persisting.flush(timeout=60)
    name = persisting.latest()
    assert name is not None
    assert persisting.load(name) == ({"commits": 7}, 7)
    persisting.close()


def test_a_newer_copy_supersedes_one_waiting_to_be_tried_again(tmp_path: Path) -> None:
    down = tmp_path / "server-down"
    down.touch()
    persisting = persistence(tmp_path, down)
    persisting.committed(CommittedState(commits=1))
    time.sleep(2.0)  # the first copy has failed and waits for its next try
    down.unlink()
    started = time.monotonic()
    persisting.committed(CommittedState(commits=2))
    persisting.flush(timeout=60)
    assert time.monotonic() - started < 10  # the newer copy did not wait out the older one's pauses
    name = persisting.latest()
    assert name is not None
    assert persisting.load(name)[1] == 2
    persisting.close()
