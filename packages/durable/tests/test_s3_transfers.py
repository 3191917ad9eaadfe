"""S3 transfers against a real SeaweedFS server: parallel parts within a memory budget, multipart uploads
aborted on the server when a deadline cancels them, and restores with read-only credentials (no lease)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import s3fs
from conftest import new_bucket, tree_contents

from elastrain.durable import CheckpointNotFoundError, CheckpointStore, FsspecSyncClient, StorageTimeoutError
from elastrain_testutils.storage_servers import SeaweedS3

MIB = 1 << 20


def raw_fs(server: SeaweedS3, **options: Any) -> s3fs.S3FileSystem:
    return s3fs.S3FileSystem(**server.storage_options(**options), skip_instance_cache=True)


def open_uploads(server: SeaweedS3, bucket: str) -> list[str]:
    listing = raw_fs(server).call_s3("list_multipart_uploads", Bucket=bucket)
    return [upload["Key"] for upload in listing.get("Uploads", [])]


def big_folder(root: Path, sizes_mib: tuple[int, ...]) -> Path:
    root.mkdir()
    for index, size in enumerate(sizes_mib):
        (root / f"part-{index}.bin").write_bytes(os.urandom(size * MIB))
    return root


def test_parts_move_in_parallel_within_a_one_part_budget(seaweed_s3: SeaweedS3, tmp_path: Path) -> None:
    """A budget of one part in flight: several big files share it without a deadlock, both ways."""
    source = big_folder(tmp_path / "source", (12, 11, 1))
    bucket = new_bucket(seaweed_s3)
    client = FsspecSyncClient(raw_fs(seaweed_s3), part_size=5 * MIB, max_bytes_in_flight=5 * MIB)
    with CheckpointStore(f"s3://{bucket}/job", sync_client=client, timeout_s=120) as store:
        committed = store.save(source, step=1)
        store.restore(committed, local_dir=tmp_path / "restored")
    assert tree_contents(tmp_path / "restored") == tree_contents(source)
    assert open_uploads(seaweed_s3, bucket) == []


def test_a_deadline_aborts_the_multipart_upload_on_the_server(seaweed_s3: SeaweedS3, tmp_path: Path) -> None:
    source = big_folder(tmp_path / "source", (64,))
    bucket = new_bucket(seaweed_s3)
    client = FsspecSyncClient(raw_fs(seaweed_s3), part_size=5 * MIB, max_bytes_in_flight=10 * MIB)
    with pytest.raises(StorageTimeoutError):
        client.upload(str(source), f"s3://{bucket}/job/checkpoint", timeout_s=0.4)
    assert open_uploads(seaweed_s3, bucket) == []
    # An upload left open some other way (its writer was killed) goes when its folder is deleted.
    raw = raw_fs(seaweed_s3)
    raw.call_s3("create_multipart_upload", Bucket=bucket, Key="job/checkpoint/part-0.bin")
    assert open_uploads(seaweed_s3, bucket) == ["job/checkpoint/part-0.bin"]
    client.delete(f"s3://{bucket}/job/checkpoint", timeout_s=30)
    assert open_uploads(seaweed_s3, bucket) == []


def test_a_read_only_restore_works_without_a_lease(
    seaweed_s3: SeaweedS3, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    bucket = new_bucket(seaweed_s3)
    uri = f"s3://{bucket}/job"
    source = big_folder(tmp_path / "source", (1,))
    with CheckpointStore(uri, storage_options=seaweed_s3.storage_options(), num_to_keep=1) as writer:
        first = writer.save(source, step=1)
        with CheckpointStore(uri, storage_options=seaweed_s3.storage_options(read_only=True)) as reader:
            assert reader.restore(local_dir=tmp_path / "plain").name == first.name
            assert "without a reader lease" in caplog.text
            assert raw_fs(seaweed_s3).ls(f"{bucket}/job", refresh=True)  # and nothing was written by it
            assert not raw_fs(seaweed_s3).exists(f"{bucket}/job/_readers/")

            # The writer (another process) collects the checkpoint while the reader downloads it: the restore
            # says so, and restoring "the latest" moves on to the new latest.
            class WriterCollectsMeanwhile(FsspecSyncClient):
                next_step = 0

                def _download_described(self, uri: str, local_dir: str, *, timeout_s: float) -> Any:
                    if self.next_step:
                        save_in_another_process(uri.rsplit("/", 1)[0], seaweed_s3, source, self.next_step)
                        self.next_step = 0
                    return super()._download_described(uri, local_dir, timeout_s=timeout_s)

            for target, next_step in (("named", 2), ("latest", 3)):
                client = WriterCollectsMeanwhile(raw_fs(seaweed_s3, read_only=True))
                client.next_step = next_step
                with CheckpointStore(uri, sync_client=client) as racing:
                    if target == "named":
                        with pytest.raises(CheckpointNotFoundError, match="collected while it was being restored"):
                            racing.restore(racing.latest(), local_dir=tmp_path / target)
                    else:
                        assert racing.restore(local_dir=tmp_path / target).step == 3
                        assert tree_contents(tmp_path / target) == tree_contents(source)


def save_in_another_process(uri: str, server: SeaweedS3, source: Path, step: int) -> None:
    script = (
        "import json, sys\n"
        "from elastrain.durable import CheckpointStore\n"
        "uri, options, source, step = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], int(sys.argv[4])\n"
        "with CheckpointStore(uri, storage_options=options, num_to_keep=1) as store:\n"
        "    store.save(source, step=step)\n"
    )
    options = json.dumps(server.storage_options())
    subprocess.run([sys.executable, "-c", script, uri, options, str(source), str(step)], check=True, timeout=120)
