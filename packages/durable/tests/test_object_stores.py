"""The store against real S3 servers (moto, SeaweedFS) and a real GCS server (fake-gcs-server) on 127.0.0.1."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from conftest import (
    assert_an_uncommit_cut_short_is_finished,
    assert_save_fails_within_its_deadline,
    make_tree,
    new_bucket,
    silent_server,
    tree_contents,
)

from elastrain.durable import ArrowSyncClient, CheckpointCorruptedError, CheckpointStore, StorageError
from elastrain_testutils.storage_servers import ACCESS_KEY, SECRET_KEY, FakeGcs, MotoS3, SeaweedS3
from elastrain_testutils.waiting import wait_until

Server = MotoS3 | SeaweedS3 | FakeGcs


@pytest.fixture(params=["moto", "seaweedfs", "gcs"])
def server(request: pytest.FixtureRequest) -> Server:
    fixture = {"moto": "moto_s3", "seaweedfs": "seaweed_s3", "gcs": "fake_gcs"}[request.param]
    value: Server = request.getfixturevalue(fixture)
    return value


def store_for(server: Server, *, client: str = "fsspec", **options: Any) -> CheckpointStore:
    scheme = "gs" if isinstance(server, FakeGcs) else "s3"
    uri = f"{scheme}://{new_bucket(server)}/runs/job-1"
    if client == "arrow":
        assert not isinstance(server, FakeGcs)
        return CheckpointStore(
            uri, sync_client=ArrowSyncClient(server.arrow_filesystem(), chunk_size=1 << 20), **options
        )
    return CheckpointStore(uri, storage_options=server.storage_options(), **options)


def remote_names(store: CheckpointStore, uri: str) -> list[str]:
    return store.client.list_names(uri, timeout_s=30)


def test_round_trip_gc_and_resume(server: Server, tmp_path: Path, tree: Path) -> None:
    round_trip(store_for(server, num_to_keep=2, score_attribute="loss", score_order="min"), server, tmp_path, tree)


@pytest.mark.parametrize("s3_server", ["moto_s3", "seaweed_s3"])
def test_round_trip_through_pyarrow(s3_server: str, request: pytest.FixtureRequest, tmp_path: Path, tree: Path) -> None:
    """ArrowSyncClient writes the store's layout: the default client, below, reads what pyarrow wrote."""
    server: Server = request.getfixturevalue(s3_server)
    store = store_for(server, client="arrow", num_to_keep=2, score_attribute="loss", score_order="min")
    round_trip(store, server, tmp_path, tree)


@pytest.mark.parametrize(
    ("fixture", "client"),
    [("moto_s3", "fsspec"), ("seaweed_s3", "fsspec"), ("fake_gcs", "fsspec"), ("seaweed_s3", "arrow")],
)
def test_a_collection_cut_short_is_finished_later(
    fixture: str, client: str, request: pytest.FixtureRequest, tmp_path: Path, tree: Path
) -> None:
    server: Server = request.getfixturevalue(fixture)
    with store_for(server, client=client) as remembering:
        uri = remembering.location.root
        options = server.storage_options()
        assert_an_uncommit_cut_short_is_finished(
            remembering, lambda: CheckpointStore(uri, storage_options=options), tree, tmp_path
        )


def round_trip(store: CheckpointStore, server: Server, tmp_path: Path, tree: Path) -> None:
    with store:
        for step, loss in enumerate([0.9, 0.1, 0.5, 0.7]):
            store.save(tree, metrics={"loss": loss}, step=step)
        store.wait()
        assert [c.step for c in store.list()] == [1, 3]
        # Exactly two checkpoints remain in the bucket itself: files and manifests.
        root = store.location.root
        assert len([n for n in remote_names(store, root) if n.startswith("checkpoint_")]) == 2
        assert len(remote_names(store, f"{root}/_manifests")) == 2
    with CheckpointStore(root, storage_options=server.storage_options()) as fresh:  # a new process would do the same
        restored = fresh.restore(local_dir=tmp_path / "out")
        assert restored.step == 3
        assert restored.metrics == {"loss": 0.7}
    assert tree_contents(tmp_path / "out") == tree_contents(tree)


def test_a_single_file_is_deleted_alone_in_one_request(server: Server) -> None:
    """Markers and leases go with one request; a file already gone is no error, and its neighbours stay."""
    store = store_for(server)
    client = store.client
    folder = store.location.join("_pending")
    for name in ("a.json", "b.json"):
        client.write_bytes(f"{folder}/{name}", b"{}", timeout_s=30)
    requests: list[str] = []
    if not isinstance(server, FakeGcs):  # count what reaches the S3 server
        events = client.filesystem.s3.meta.events  # type: ignore[attr-defined]
        events.register("before-send.s3", lambda request, **_: requests.append(request.method))
    client.delete_file(f"{folder}/a.json", timeout_s=30)
    client.delete_file(f"{folder}/a.json", timeout_s=30)  # again: already gone
    if not isinstance(server, FakeGcs):
        assert requests == ["DELETE", "DELETE"]
    assert remote_names(store, folder) == ["b.json"]
    store.close()


def test_big_file_round_trip(moto_s3: MotoS3, tmp_path: Path) -> None:
    source = make_tree(tmp_path / "big", big_bytes=100 << 20)
    with store_for(moto_s3) as store:
        saved = store.save_async(source, step=1).result(300)
        assert saved.total_bytes > 100 << 20
        store.restore(local_dir=tmp_path / "out")
    assert tree_contents(tmp_path / "out") == tree_contents(source)


def test_corrupted_object_fails_restore(server: Server, tmp_path: Path, tree: Path) -> None:
    with store_for(server) as store:
        saved = store.save(tree)
        fs = store.client.filesystem  # type: ignore[attr-defined]
        fs.pipe_file(fs._strip_protocol(f"{store.location.root}/{saved.name}/optimizer.pt"), b"tampered")
        with pytest.raises(CheckpointCorruptedError, match=r"optimizer\.pt has 8 bytes"):
            store.restore(local_dir=tmp_path / "out")


def test_credentials_never_appear(
    moto_s3: MotoS3, tmp_path: Path, tree: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="elastrain.durable")
    with store_for(moto_s3, retries=1) as store:
        saved = store.save(tree, metrics={"loss": 1.0})
        manifest = store.client.read_bytes(f"{store.location.root}/_manifests/{saved.name}/MANIFEST.json", timeout_s=30)
        texts = [repr(store), repr(saved), repr(store.client), manifest.decode(), json.dumps(saved.metrics)]
    # A wrong endpoint makes every attempt fail: the errors and warnings must not carry the secret either.
    broken = {**moto_s3.storage_options(), "client_kwargs": {"endpoint_url": "http://127.0.0.1:9"}}
    with CheckpointStore("s3://no-bucket/x", storage_options=broken, retries=1, timeout_s=20) as bad:
        with pytest.raises(StorageError) as caught:
            bad.save(tree)
        texts += [str(caught.value), repr(bad)]
    texts += [record.getMessage() for record in caplog.records]
    assert not [text for text in texts if SECRET_KEY in text], "the secret key leaked"
    assert any("127.0.0.1:9" in text or "no-bucket" in text for text in texts)
    assert ACCESS_KEY not in repr(store)


# -- faults (SeaweedFS keeps its data on disk, so it can be killed and restarted) ----------------------------------


@pytest.mark.parametrize("client", ["fsspec", "arrow"])
def test_server_killed_mid_upload(seaweed_s3: SeaweedS3, tmp_path: Path, tree: Path, client: str) -> None:
    store = store_for(seaweed_s3, client=client, retries=2, timeout_s=20)
    try:
        first = store.save(tree, step=0)
        big = make_tree(tmp_path / "big", big_bytes=64 << 20)
        future = store.save_async(big, step=1)
        # Kill the server once the upload has begun (its marker is written first).
        wait_until(
            lambda: remote_names(store, f"{store.location.root}/_pending"), timeout_s=30, what="the upload to start"
        )
        seaweed_s3.kill()
        with pytest.raises(StorageError, match="uploading"):
            future.result(120)
        seaweed_s3.start()
        assert store.list() == [first]  # no partial checkpoint is listed
        store.restore(local_dir=tmp_path / "out")
        assert tree_contents(tmp_path / "out") == tree_contents(tree)
        third = store.save(tree, step=2)  # saves work again, and collect the unfinished upload
        store.wait()
        assert [c.name for c in store.list()] == [first.name, third.name]
        assert len([n for n in remote_names(store, store.location.root) if n.startswith("checkpoint_")]) == 2
    finally:
        if seaweed_s3.process is None:
            seaweed_s3.start()
        store.close()


def test_a_server_that_never_answers_hits_the_deadline(tree: Path) -> None:
    """It accepts connections and never replies: an S3 PUT would otherwise hang forever."""
    with silent_server() as port:
        options = {
            "key": ACCESS_KEY,
            "secret": SECRET_KEY,
            "client_kwargs": {"endpoint_url": f"http://127.0.0.1:{port}"},
        }
        store = CheckpointStore("s3://silent/run", storage_options=options, timeout_s=3, retries=0)
        assert_save_fails_within_its_deadline(store, tree)
