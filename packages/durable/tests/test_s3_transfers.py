"""S3 transfers against a real SeaweedFS server: parallel parts within a memory budget, multipart uploads
aborted on the server when a deadline cancels them, bodies checksummed for the server, and restores with
read-only credentials (no lease)."""

from __future__ import annotations

import asyncio
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import s3fs
from conftest import new_bucket, tree_contents

from elastrain.durable import (
    CheckpointNotFoundError,
    CheckpointStore,
    FsspecSyncClient,
    StorageError,
    StorageTimeoutError,
)
from elastrain.durable._private.s3_transfer import S3Transfer, s3_storage_options
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


class CountingTransfer(S3Transfer):
    """Counts parts in flight (held in memory) to check the budget, and can hold uploads of parts forever."""

    def __init__(self, *args: Any, stall_parts: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stall_parts = stall_parts
        self.in_flight = self.most_in_flight = self.created = 0

    def _count(self, change: int) -> None:
        self.in_flight += change
        self.most_in_flight = max(self.most_in_flight, self.in_flight)

    async def _create(self, bucket: str, key: str) -> str:
        self.created += 1
        return await super()._create(bucket, key)

    async def _part(self, *args: Any) -> dict[str, Any]:
        self._count(1)
        try:
            if self.stall_parts:
                await asyncio.Event().wait()  # a server that stops answering
            return await super()._part(*args)
        finally:
            self._count(-1)

    async def _get(self, *args: Any) -> bytes:
        self._count(1)
        try:
            return await super()._get(*args)
        finally:
            self._count(-1)


class CountingClient(FsspecSyncClient):
    def __init__(self, *args: Any, stall_parts: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.transfer = CountingTransfer(
            self.filesystem,
            part_size=self.part_size,
            max_bytes_in_flight=self.max_bytes_in_flight,
            max_concurrency=self.max_concurrency,
            stall_parts=stall_parts,
        )

    def _s3(self) -> S3Transfer:
        return self.transfer


def test_parts_move_in_parallel_within_the_budget(seaweed_s3: SeaweedS3, tmp_path: Path) -> None:
    """Three parts' budget: several big files share it, parts move several at a time, never more, both ways."""
    source = big_folder(tmp_path / "source", (12, 11, 1))
    bucket = new_bucket(seaweed_s3)
    client = CountingClient(raw_fs(seaweed_s3), part_size=5 * MIB, max_bytes_in_flight=15 * MIB)
    with CheckpointStore(f"s3://{bucket}/job", sync_client=client, timeout_s=120) as store:
        committed = store.save(source, step=1)
        uploaded_at_once = client.transfer.most_in_flight
        client.transfer.most_in_flight = 0
        store.restore(committed, local_dir=tmp_path / "restored")
    assert tree_contents(tmp_path / "restored") == tree_contents(source)
    assert 2 <= uploaded_at_once <= 3
    assert 2 <= client.transfer.most_in_flight <= 3
    assert open_uploads(seaweed_s3, bucket) == []


def test_bodies_go_checksummed_not_hashed_again_and_a_changed_one_is_refused(
    seaweed_s3: SeaweedS3, tmp_path: Path
) -> None:
    """A store's own client sends every body with a checksum header the server verifies, instead of a second
    SHA-256 of it for the signature (botocore's habit over plain http): a body changed after it was checksummed
    is refused by the server, and nothing is committed."""
    source = big_folder(tmp_path / "source", (33,))  # three parts of the default 16 MiB
    (source / "small.json").write_text("{}")  # one request
    bucket = new_bucket(seaweed_s3)
    headers: list[dict[str, str]] = []

    def record(request: Any, **_: Any) -> None:
        headers.append({name.lower(): _text(value) for name, value in request.headers.items()})

    given: list[list[str]] = []
    with CheckpointStore(f"s3://{bucket}/job", storage_options=seaweed_s3.storage_options(), timeout_s=30) as store:
        events = store.client.filesystem.s3.meta.events  # type: ignore[attr-defined]
        events.register(
            "before-parameter-build.s3.UploadPart",
            lambda params, **_: given.append(sorted(name for name in params if name.startswith("Checksum"))),
        )
        events.register("before-send.s3.UploadPart", record)
        events.register("before-send.s3.PutObject", record)
        committed = store.save(source, step=1)
        bodies = [h for h in headers if int(h.get("content-length", 0)) > 1 or "x-amz-checksum-crc32" in h]
        assert len(bodies) >= 4  # three parts and the small file, at least
        assert all(h["x-amz-content-sha256"] == "UNSIGNED-PAYLOAD" for h in bodies)
        assert all("x-amz-checksum-crc32" in h for h in bodies)
        assert given == [["ChecksumCRC32"]] * 3  # taken in the reading thread, not by botocore on the loop

        events.register("before-send.s3.UploadPart", _change_one_byte)
        with pytest.raises(StorageError, match="did not match"):
            store.save(source, step=2)
        assert store.list() == [committed]


def test_where_checksums_are_only_sent_when_required_bodies_stay_signed(seaweed_s3: SeaweedS3, tmp_path: Path) -> None:
    """Some S3-compatible servers refuse checksum headers; botocore's setting for them is honoured."""
    source = big_folder(tmp_path / "source", (33,))
    bucket = new_bucket(seaweed_s3)
    headers: list[dict[str, str]] = []

    def record(request: Any, **_: Any) -> None:
        headers.append({name.lower(): _text(value) for name, value in request.headers.items()})

    options = seaweed_s3.storage_options(request_checksum_calculation="when_required")
    with CheckpointStore(f"s3://{bucket}/job", storage_options=options, timeout_s=30) as store:
        store.client.filesystem.s3.meta.events.register("before-send.s3.UploadPart", record)  # type: ignore[attr-defined]
        committed = store.save(source, step=1)
        store.restore(committed, local_dir=tmp_path / "restored")
    assert len(headers) == 3
    assert not any(name.startswith("x-amz-checksum") for h in headers for name in h)
    assert all(len(h["x-amz-content-sha256"]) == 64 for h in headers)  # the body's SHA-256, signed
    assert tree_contents(tmp_path / "restored") == tree_contents(source)


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _change_one_byte(request: Any, **_: Any) -> None:
    """What a faulty link or buffer does to a body after its checksum was taken."""
    data = request.body.getvalue()
    if len(data) > MIB:  # a part, not the markers' and manifests' small documents
        request.body = io.BytesIO(bytes([data[0] ^ 1]) + data[1:])


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ({}, {"config_kwargs": {"s3": {"payload_signing_enabled": False}}}),
        (
            {"key": "k", "config_kwargs": {"read_timeout": 5, "s3": {"addressing_style": "path"}}},
            {
                "key": "k",
                "config_kwargs": {
                    "read_timeout": 5,
                    "s3": {"addressing_style": "path", "payload_signing_enabled": False},
                },
            },
        ),
        # What the caller chose stays: signing asked for, or checksums only where required (then signing is
        # what covers a body).
        ({"config_kwargs": {"s3": {"payload_signing_enabled": True}}}, None),
        ({"config_kwargs": {"request_checksum_calculation": "when_required"}}, None),
    ],
)
def test_a_stores_own_s3_options_leave_checksummed_bodies_unsigned(
    given: dict[str, Any], expected: dict[str, Any] | None
) -> None:
    assert s3_storage_options(given) == (given if expected is None else expected)


@pytest.mark.parametrize("where", ["options", "environment"])
def test_checksums_only_when_required_keep_bodies_signed_however_it_is_said(
    where: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """botocore takes the setting from its config, the environment or the profile, in any case."""
    given: dict[str, Any] = {"key": "k"}
    if where == "options":
        given["config_kwargs"] = {"request_checksum_calculation": "WHEN_REQUIRED"}
    else:
        monkeypatch.setenv("AWS_REQUEST_CHECKSUM_CALCULATION", "When_Required")
    assert s3_storage_options(given) == given


def test_a_filesystem_passed_in_is_used_as_configured(seaweed_s3: SeaweedS3, tmp_path: Path) -> None:
    """Signing and checksums stay botocore's where the caller made the filesystem: no checksum is set by hand
    (that would make botocore sign bodies over https too)."""
    source = big_folder(tmp_path / "source", (33,))
    bucket = new_bucket(seaweed_s3)
    given: list[list[str]] = []
    headers: list[dict[str, str]] = []
    fs = raw_fs(seaweed_s3)
    with CheckpointStore(f"s3://{bucket}/job", sync_client=FsspecSyncClient(fs), timeout_s=30) as store:
        store.list()  # connects
        events = fs.s3.meta.events
        events.register(
            "before-parameter-build.s3.UploadPart",
            lambda params, **_: given.append(sorted(name for name in params if name.startswith("Checksum"))),
        )
        events.register(
            "before-send.s3.UploadPart",
            lambda request, **_: headers.append({k.lower(): _text(v) for k, v in request.headers.items()}),
        )
        store.save(source, step=1)
    assert given == [[], [], []]
    assert all(len(h["x-amz-content-sha256"]) == 64 for h in headers)  # botocore signs over http
    assert all("x-amz-checksum-crc32" in h for h in headers)  # and checksums, as it does by default


def test_a_deadline_aborts_the_multipart_upload_on_the_server(seaweed_s3: SeaweedS3, tmp_path: Path) -> None:
    source = big_folder(tmp_path / "source", (12,))
    bucket = new_bucket(seaweed_s3)
    client = CountingClient(raw_fs(seaweed_s3), part_size=5 * MIB, stall_parts=True)
    with pytest.raises(StorageTimeoutError):
        client.upload(str(source), f"s3://{bucket}/job/checkpoint", timeout_s=2)
    assert client.transfer.created == 1  # the upload was really under way on the server
    assert open_uploads(seaweed_s3, bucket) == []
    # An upload left open some other way (its writer was killed) goes when its checkpoint is collected.
    raw = raw_fs(seaweed_s3)
    raw.call_s3("create_multipart_upload", Bucket=bucket, Key="job/checkpoint/part-0.bin")
    assert open_uploads(seaweed_s3, bucket) == ["job/checkpoint/part-0.bin"]
    client._abort_open_uploads(f"s3://{bucket}/job/checkpoint", timeout_s=30)
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
                        # fallback=True too: an older checkpoint is no substitute for a collected latest.
                        assert racing.restore(local_dir=tmp_path / target, fallback=True).step == 3
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
