"""Durable checkpoints: how long training waits, and how fast checkpoints move, against raw s3fs and pyarrow.

Same run, same bytes: a 256 MiB checkpoint of four files, saved to a SeaweedFS S3 server on 127.0.0.1.
- training-blocked time per checkpoint: ``save_async`` (returns once staged) vs ``save`` (returns once committed);
- upload: ``CheckpointStore.save`` vs a raw ``s3fs`` ``put`` of the same folder (throughput ≥ 0.9× means time
  ≤ 1.11×), and vs Ray Train's persistence path (``pyarrow.fs.copy_files`` to S3, throughput ≥ 1.0×), with the
  default client and with ``ArrowSyncClient`` (pyarrow's S3 client, checksumming the bytes it moves);
- restore: ``CheckpointStore.restore`` (download + SHA-256 check) vs a raw ``s3fs`` ``get`` (≤ 1.3×) and vs
  ``pyarrow.fs.copy_files`` from S3, reported; with ``ArrowSyncClient`` vs ``pyarrow.fs.copy_files`` (≤ 1.3×);
- a new process's first ``list()`` of 100 committed checkpoints vs reading their manifests one by one.
Rounds are interleaved, the order of the variants rotating every round (12 rounds: each variant goes first in three);
every timed transfer starts after ``os.sync()``, so none pays for the writeback of the one before. Rows show
medians.
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchlib import Row, parse_args, write_results
from elastrain.durable import ArrowSyncClient, CheckpointStore
from elastrain_testutils.storage_servers import ACCESS_KEY, SECRET_KEY, SeaweedS3

FILE_MIB = (128, 64, 48, 16)  # 256 MiB in all
MANY = 100


def make_checkpoint(folder: Path) -> int:
    folder.mkdir(parents=True)
    for index, mib in enumerate(FILE_MIB):
        with open(folder / f"part-{index}.bin", "wb") as out:
            for _ in range(mib):
                out.write(os.urandom(1 << 20))
    return sum(FILE_MIB) << 20


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def settled_timed(fn: Callable[[], object]) -> float:
    """``timed``, once the page cache has written back what came before: the server shares this machine's disk,
    and writeback of the previous transfer's bytes would otherwise land in whichever transfer comes next."""
    os.sync()
    return timed(fn)


def measure_round(
    round_: int,
    store: CheckpointStore,
    arrow_store: CheckpointStore,
    source: Path,
    raw: Any,
    arrow: Any,
    scratch: Path,
    record: Callable[[str, float], None],
) -> None:
    import pyarrow.fs

    # Training-blocked time: the previous upload has finished, as it would between checkpoints.
    store.wait()
    started = time.perf_counter()
    future = store.save_async(source, step=round_)
    record("save_async blocked", time.perf_counter() - started)
    record("save_async commit", timed(future.result))
    store.wait()
    started = time.perf_counter()
    linked = store.save_async(source, step=round_, staging="link")
    record("save_async link blocked", time.perf_counter() - started)
    linked.result()
    store.wait()  # its collection too: it runs in the upload thread, ahead of the next upload

    # Throughput: the uploads, then the downloads, each in an order that rotates every round (the first
    # transfer after a burst of writes is slower on this server; no variant should always be first).
    target, arrow_target = f"bench/raw-{round_}", f"bench/arrow-{round_}"
    uploads: list[tuple[str, Callable[[], object], Callable[[], object]]] = [
        ("save", lambda: store.save(source), store.wait),  # the collection after it is not timed
        ("save arrow", lambda: arrow_store.save(source), arrow_store.wait),
        ("s3fs put", lambda: raw.put(str(source), target, recursive=True), lambda: raw.rm(target, recursive=True)),
        (
            "pyarrow copy_files",
            lambda: pyarrow.fs.copy_files(str(source), arrow_target, destination_filesystem=arrow),
            lambda: raw.rm(arrow_target, recursive=True),
        ),
    ]
    for name, run, clean in rotated(uploads, round_):
        record(name, settled_timed(run))
        clean()
    latest = store.latest()
    assert latest is not None
    kinds = ("restored", "restored-arrow", "fetched", "arrowed")
    restored, restored_arrow, fetched, arrowed = (scratch / f"{kind}-{round_}" for kind in kinds)
    arrowed.mkdir()  # pyarrow creates files, not the folder
    downloads: list[tuple[str, Callable[[], object], Path]] = [
        ("restore", lambda: store.restore(local_dir=restored), restored),
        ("restore arrow", lambda: arrow_store.restore(local_dir=restored_arrow), restored_arrow),
        ("s3fs get", lambda: raw.get(f"bench/store/{latest.name}/", str(fetched), recursive=True), fetched),
        (
            "pyarrow copy_files get",
            lambda: pyarrow.fs.copy_files(f"bench/store/{latest.name}", str(arrowed), source_filesystem=arrow),
            arrowed,
        ),
    ]
    for name, run, folder in rotated(downloads, round_):
        record(name, settled_timed(run))
        shutil.rmtree(folder)


def rotated(items: list[Any], by: int) -> list[Any]:
    shift = by % len(items)
    return items[shift:] + items[:shift]


def measure_listing(options: dict[str, Any], record: Callable[[str, float], None]) -> None:
    """A new store's first list() over many manifests (read in one batch) vs reading them one after another."""
    import s3fs

    uri = "s3://bench/many"
    fresh_store = CheckpointStore(uri, storage_options=options)
    listed = timed(fresh_store.list)
    fresh_store.close()

    def one_after_another() -> None:
        fresh = s3fs.S3FileSystem(**options, skip_instance_cache=True)  # a new process starts cold too
        for path in fresh.ls("bench/many/_manifests", refresh=True):
            fresh.cat_file(f"{path}/MANIFEST.json")

    one_by_one = timed(one_after_another)
    record("list 100", listed)
    record("manifests one by one", one_by_one)


def fill_many(options: dict[str, Any], scratch: Path) -> None:
    tiny = scratch / "tiny"
    tiny.mkdir()
    (tiny / "w.bin").write_bytes(b"w")
    with CheckpointStore("s3://bench/many", storage_options=options) as store:
        for step in range(MANY):
            store.save_async(tiny, step=step)


def main() -> None:
    args = parse_args(__doc__ or "")
    rounds = 4 if args.quick else 12  # a multiple of the 4 variants: each is first in as many rounds
    samples: dict[str, list[float]] = {}

    def record(name: str, seconds: float) -> None:
        samples.setdefault(name, []).append(seconds)

    with tempfile.TemporaryDirectory(prefix="elastrain-bench-") as scratch, SeaweedS3() as server:
        source = Path(scratch, "checkpoint")
        total = make_checkpoint(source)
        server.create_bucket("bench")
        options = server.storage_options(read_timeout=60)
        import pyarrow.fs
        import s3fs

        raw = s3fs.S3FileSystem(**options, skip_instance_cache=True)
        arrow = pyarrow.fs.S3FileSystem(
            access_key=ACCESS_KEY, secret_key=SECRET_KEY, endpoint_override=server.endpoint_url, scheme="http"
        )
        store = CheckpointStore("s3://bench/store", storage_options=options, num_to_keep=1)
        store.save(source)  # warm: connections, bucket, listing
        arrow_store = CheckpointStore("s3://bench/arrow-store", sync_client=ArrowSyncClient(arrow), num_to_keep=1)
        arrow_store.save(source)
        fill_many(options, Path(scratch))
        for round_ in range(rounds):
            measure_round(round_, store, arrow_store, source, raw, arrow, Path(scratch), record)
            measure_listing(options, record)
        store.close()
        arrow_store.close()

    median = {name: statistics.median(values) for name, values in samples.items()}
    case = f"{total >> 20} MiB, {len(FILE_MIB)} files, SeaweedFS S3"
    rows = [
        Row(case, "training blocked: save_async (staged copy)", median["save_async blocked"], "save (blocks to commit)",
            median["save"], 0.1),
        Row(case, "training blocked: save_async(staging='link')", median["save_async link blocked"],
            "save (blocks to commit)", median["save"], None),
        Row(case, "upload: save (time; ≤ 1.11× = throughput ≥ 0.9×)", median["save"], "raw s3fs put",
            median["s3fs put"], 1 / 0.9),
        Row(case, "upload: save (time; ≤ 1.0× = throughput ≥ Ray Train's)", median["save"],
            "Ray Train path (pyarrow.fs.copy_files)", median["pyarrow copy_files"], 1.0),
        Row(case, "upload: save with ArrowSyncClient (time; ≤ 1.0×)", median["save arrow"],
            "Ray Train path (pyarrow.fs.copy_files)", median["pyarrow copy_files"], 1.0),
        Row(case, "restore (download + SHA-256 check)", median["restore"], "raw s3fs get", median["s3fs get"], 1.3),
        Row(case, "restore with ArrowSyncClient", median["restore arrow"], "pyarrow.fs.copy_files from S3",
            median["pyarrow copy_files get"], 1.3),
        Row(case, "restore (download + SHA-256 check)", median["restore"], "pyarrow.fs.copy_files from S3",
            median["pyarrow copy_files get"], None),
        Row(f"{MANY} committed checkpoints, SeaweedFS S3", "a new store's first list()", median["list 100"],
            "raw s3fs: the manifests read one by one", median["manifests one by one"], None),
    ]  # fmt: skip
    notes = {
        "rounds": rounds,
        "throughput_MBps": {
            name: round(total / 1e6 / value, 1)
            for name, value in median.items()
            if "blocked" not in name and name not in ("list 100", "manifests one by one")
        },
        "samples_s": {name: [round(v, 3) for v in values] for name, values in samples.items()},
    }
    write_results("durable", rows, args.output, notes=notes)


if __name__ == "__main__":
    main()
