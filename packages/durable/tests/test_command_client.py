"""CommandSyncClient: user commands move the bytes; templates are checked up front; paths never reach a shell."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from conftest import tree_contents

from elastrain.durable import CheckpointStore, CommandFailedError, CommandSyncClient, StorageTimeoutError

# Local stand-ins for `aws s3 sync` and `aws s3 rm --recursive`: compound commands go through `sh -c` with the
# paths as arguments ("$0", "$1"), never pasted into the script.
SYNC = 'sh -c \'mkdir -p "$1" && if [ -d "$0" ]; then cp -R "$0"/. "$1"; fi\' {source} {target}'
DELETE = "rm -rf {target}"


def local_client() -> CommandSyncClient:
    return CommandSyncClient(sync_up=SYNC, sync_down=SYNC, delete=DELETE)


def test_round_trip_gc_and_resume_through_commands(tmp_path: Path, tree: Path) -> None:
    root = tmp_path / "remote"
    with CheckpointStore(root, num_to_keep=2, sync_client=local_client()) as store:
        for step in range(4):
            store.save(tree, metrics={"loss": 1.0 / (step + 1)}, step=step)
        store.wait()
        assert [c.step for c in store.list()] == [2, 3]
    assert sorted(p.name for p in root.iterdir() if p.name.startswith("checkpoint_")) == sorted(
        p.name for p in (root / "_manifests").iterdir()
    )
    with CheckpointStore(root, sync_client=local_client()) as fresh:
        restored = fresh.restore(local_dir=tmp_path / "out")
    assert restored.step == 3
    assert tree_contents(tmp_path / "out") == tree_contents(tree)


def test_paths_cannot_inject_commands(tmp_path: Path, tree: Path) -> None:
    hostile = tmp_path / "x; touch INJECTED; $(touch INJECTED2) `touch INJECTED3`"
    with CheckpointStore(hostile, sync_client=local_client()) as store:
        store.save(tree)
        store.restore(local_dir=tmp_path / "out")
    assert not list(tmp_path.glob("INJECTED*"))
    assert not list(Path.cwd().glob("INJECTED*"))
    assert tree_contents(tmp_path / "out") == tree_contents(tree)


@pytest.mark.parametrize(
    ("templates", "message"),
    [
        ({"sync_up": "aws s3 sync {source}"}, r"sync_up template .* must contain \{target\}"),
        ({"sync_down": "cp {source} {dest}"}, r"uses \{dest\}; it may use only \{source\}, \{target\}"),
        ({"delete": "rm -rf {target} {source}"}, r"uses \{source\}; it may use only \{target\}"),
        ({"delete": "rm -rf '{target}"}, "cannot be split into arguments"),
        ({"delete": ""}, "delete must be a command template"),
        ({"sync_up": "no-such-tool-here {source} {target}"}, "'no-such-tool-here' is not on PATH"),
        ({"sync_up": "{source} {target}"}, "must start with a command"),
        ({"delete": "rm {target!r}"}, r"uses \{target\}"),
    ],
)
def test_templates_are_checked_up_front(templates: dict[str, str], message: str) -> None:
    arguments = {"sync_up": SYNC, "sync_down": SYNC, "delete": DELETE, **templates}
    with pytest.raises(ValueError, match=message):
        CommandSyncClient(**arguments)


def test_a_failing_command_is_reported_with_its_output(tmp_path: Path, tree: Path) -> None:
    client = CommandSyncClient(
        sync_up="sh -c 'echo \"bucket does not exist: $1\" >&2; exit 3' {source} {target}",
        sync_down=SYNC,
        delete=DELETE,
    )
    with CheckpointStore(tmp_path / "remote", sync_client=client, retries=1) as store:
        future = store.save_async(tree)
        with pytest.raises(CommandFailedError, match="exited with status 3: bucket does not exist") as caught:
            future.result(60)
        assert "2 attempt(s)" in str(caught.value)
        assert store.list() == []
    # Unobserved, the failure surfaces at close: it is never lost.
    store = CheckpointStore(tmp_path / "remote", sync_client=client, retries=0)
    store.save_async(tree)
    with pytest.raises(CommandFailedError):
        store.close()


def test_a_hanging_command_is_killed_at_the_deadline(tmp_path: Path, tree: Path) -> None:
    client = CommandSyncClient(sync_up="sh -c 'sleep 60' {source} {target}", sync_down=SYNC, delete=DELETE)
    store = CheckpointStore(tmp_path / "remote", sync_client=client, timeout_s=1.5, retries=0)
    started = time.monotonic()
    with pytest.raises(StorageTimeoutError):
        store.save(tree)
    assert time.monotonic() - started < 10
    assert store.list() == []
    store.close()  # the error was already raised by save()
