"""Staging (a private copy of a checkpoint's files, taken before the upload so training can go on writing),
checksums, and the check of a restored folder against its manifest."""

from __future__ import annotations

import concurrent.futures
import hashlib
import os
import shutil
from pathlib import Path
from typing import Literal

from elastrain.durable._private.checkpoint import Checkpoint, FileEntry
from elastrain.durable._private.errors import CheckpointCorruptedError, FilesChangedError
from elastrain.durable._private.files import walk_files

StagingMode = Literal["copy", "link", "move"]
STAGING_MODES = ("copy", "link", "move")
_CHUNK = 8 << 20
_HASH_THREADS = 4
# What changes when a file is rewritten in place (the inode stays; size or times move).
FileStamp = tuple[int, int, int, int]


def stage(local_dir: Path, staged_dir: Path, mode: StagingMode) -> None:
    """Put ``local_dir``'s files under ``staged_dir``, as fast as the filesystem allows (hashing comes later,
    off the training path).

    ``copy`` lets the kernel copy (``copy_file_range``/``sendfile``; a reflink where the filesystem has them).
    ``link`` hard-links (instant; the caller must not rewrite those files in place until the upload is done)
    and falls back to copying across filesystems. ``move`` hands the folder over.
    """
    if mode == "move":
        walk_files(local_dir)  # refuse what the upload would refuse before the folder is handed over
        shutil.move(str(local_dir), str(staged_dir))
        return
    for source, relative in walk_files(local_dir):
        target = staged_dir / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        if mode == "link":
            try:
                os.link(source, target)  # follows a symbolic link: the file it names is linked
                continue
            except OSError:
                pass  # another filesystem, or links not allowed: copy
        shutil.copyfile(source, target)


def describe(local_dir: Path) -> list[FileEntry]:
    """Sizes and SHA-256 of every file under ``local_dir`` (hashed in parallel: hashlib releases the GIL)."""
    pairs = walk_files(local_dir)
    with concurrent.futures.ThreadPoolExecutor(_HASH_THREADS, thread_name_prefix="elastrain-hash") as pool:
        described = list(pool.map(_size_and_hash, [path for path, _ in pairs]))
    return [FileEntry(relative, size, digest) for (_, relative), (size, digest) in zip(pairs, described, strict=True)]


def stamps(local_dir: Path) -> dict[str, FileStamp]:
    """Each file's inode, size and change times: compared after an upload from files the caller still owns."""
    found = {}
    for path, relative in walk_files(local_dir):
        info = os.stat(path)
        found[relative] = (info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)
    return found


def check_unchanged(local_dir: Path, before: dict[str, FileStamp]) -> None:
    after = stamps(local_dir)
    changed = sorted(name for name in before.keys() | after.keys() if before.get(name) != after.get(name))
    if changed:
        raise FilesChangedError(
            f"{len(changed)} file(s) changed while they were being uploaded, e.g. {changed[0]!r}; nothing was "
            "committed. With staging='link' the files must not be rewritten in place until the save's future is "
            "done: use staging='copy' (the default) to keep writing at once."
        )


def _size_and_hash(path: str) -> tuple[int, str]:
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as reader:
        while chunk := reader.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


def verify_folder(folder: Path, checkpoint: Checkpoint, observed: list[FileEntry] | None = None) -> None:
    """Check a downloaded folder against its manifest; files the manifest does not name are removed.

    ``observed``: sizes and checksums taken while the files were downloaded; without them the folder is read.
    """
    expected = {entry.path: entry for entry in checkpoint.files}
    for entry in describe(folder) if observed is None else observed:
        wanted = expected.pop(entry.path, None)
        if wanted is None:
            (folder / entry.path).unlink()  # not part of the checkpoint: the restored folder holds exactly its files
            continue
        if entry.size != wanted.size:
            raise CheckpointCorruptedError(
                f"{checkpoint.uri} is corrupted: {entry.path} has {entry.size} bytes, its manifest says {wanted.size}."
            )
        if entry.sha256 != wanted.sha256:
            raise CheckpointCorruptedError(f"{checkpoint.uri} is corrupted: {entry.path} fails its SHA-256 check.")
    if expected:
        raise CheckpointCorruptedError(
            f"{checkpoint.uri} is corrupted: {len(expected)} file(s) missing, e.g. {sorted(expected)[0]}."
        )
