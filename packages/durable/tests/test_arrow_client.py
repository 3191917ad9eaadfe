"""ArrowSyncClient: the store on pyarrow's S3 filesystem, against real S3 servers (moto, SeaweedFS) on 127.0.0.1."""

from __future__ import annotations

import hashlib
import pickle
from pathlib import Path
from typing import Any

import pyarrow.fs as pyarrow_fs
import pytest
from conftest import assert_save_fails_within_its_deadline, make_tree, new_bucket, silent_server, tree_contents

from elastrain.durable import ArrowSyncClient, CheckpointCorruptedError, CheckpointStore
from elastrain_testutils.storage_servers import ACCESS_KEY, SECRET_KEY, MotoS3, SeaweedS3


def arrow_store(server: MotoS3 | SeaweedS3, **options: Any) -> CheckpointStore:
    client = ArrowSyncClient(server.arrow_filesystem(), chunk_size=1 << 20)
    return CheckpointStore(f"s3://{new_bucket(server)}/runs/job-1", sync_client=client, **options)


def test_manifest_checksums_are_of_the_bytes_moved_in_chunks(seaweed_s3: SeaweedS3, tmp_path: Path) -> None:
    source = make_tree(tmp_path / "big", big_bytes=24 << 20)  # 24 one-MiB chunks, several S3 parts
    with arrow_store(seaweed_s3) as store:
        saved = store.save_async(source, step=1).result(120)
        expected = {
            path.relative_to(source).as_posix(): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in source.rglob("*")
            if path.is_file()
        }
        assert {entry.path: entry.sha256 for entry in saved.files} == expected
        store.restore(local_dir=tmp_path / "out")
    assert tree_contents(tmp_path / "out") == tree_contents(source)


def test_a_corrupted_object_fails_restore(seaweed_s3: SeaweedS3, tmp_path: Path, tree: Path) -> None:
    with arrow_store(seaweed_s3) as store:
        saved = store.save(tree)
        filesystem = seaweed_s3.arrow_filesystem()
        with filesystem.open_output_stream(f"{store.location.root[5:]}/{saved.name}/optimizer.pt") as out:
            out.write(b"tampered")
        with pytest.raises(CheckpointCorruptedError, match=r"optimizer\.pt has 8 bytes"):
            store.restore(local_dir=tmp_path / "out")


def test_a_server_that_never_answers_hits_the_deadline(tree: Path) -> None:
    with silent_server() as port:
        filesystem = pyarrow_fs.S3FileSystem(
            access_key=ACCESS_KEY,
            secret_key=SECRET_KEY,
            endpoint_override=f"127.0.0.1:{port}",
            scheme="http",
            region="us-east-1",
            request_timeout=120,  # longer than the store's deadline: the deadline is what ends it
            retry_strategy=pyarrow_fs.AwsStandardS3RetryStrategy(max_attempts=1),
        )
        store = CheckpointStore("s3://silent/run", sync_client=ArrowSyncClient(filesystem), timeout_s=3, retries=0)
        assert_save_fails_within_its_deadline(store, tree)


def test_bad_arguments_say_what_to_change(seaweed_s3: SeaweedS3, tmp_path: Path) -> None:
    import s3fs

    with pytest.raises(TypeError, match=r"pyarrow filesystem such as pyarrow\.fs\.S3FileSystem.*FsspecSyncClient"):
        ArrowSyncClient(s3fs.S3FileSystem(**seaweed_s3.storage_options()))
    with pytest.raises(ValueError, match=r"works on S3.*'local' filesystem.*give the store a path"):
        ArrowSyncClient(pyarrow_fs.LocalFileSystem())
    with pytest.raises(ValueError, match="max_concurrency must be an int of at least 1"):
        ArrowSyncClient(seaweed_s3.arrow_filesystem(), max_concurrency=0)
    with pytest.raises(ValueError, match="chunk_size must be an int of at least 65536"):
        ArrowSyncClient(seaweed_s3.arrow_filesystem(), chunk_size=1024)
    client = ArrowSyncClient(seaweed_s3.arrow_filesystem())
    with pytest.raises(ValueError, match="Pass storage_options or sync_client, not both"):
        CheckpointStore("s3://b/run", sync_client=client, storage_options=seaweed_s3.storage_options())


def test_the_client_pickles_for_ray_workers(seaweed_s3: SeaweedS3, tree: Path) -> None:
    client = ArrowSyncClient(seaweed_s3.arrow_filesystem(), max_concurrency=3, chunk_size=1 << 20)
    bucket = new_bucket(seaweed_s3)
    client.upload(str(tree), f"s3://{bucket}/folder", timeout_s=30)
    copy = pickle.loads(pickle.dumps(client))  # noqa: S301 - our own bytes
    assert (copy.max_concurrency, copy.chunk_size) == (3, 1 << 20)
    assert copy.list_names(f"s3://{bucket}/folder", timeout_s=30) == ["empty.txt", "model", "optimizer.pt"]
    assert copy.read_many([f"s3://{bucket}/folder/model/config.json", f"s3://{bucket}/none"], timeout_s=30) == {
        f"s3://{bucket}/folder/model/config.json": b'{"layers": 2}',
        f"s3://{bucket}/none": None,
    }
    copy.delete(f"s3://{bucket}/folder", timeout_s=30)
    assert copy.list_names(f"s3://{bucket}/folder", timeout_s=30) == []
