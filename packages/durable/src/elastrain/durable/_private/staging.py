"""Staging: a private copy of a checkpoint's files, taken before the upload so training can go on writing."""

from __future__ import annotations

import concurrent.futures
import hashlib
import os
import shutil
from pathlib import Path
from typing import Literal

from elastrain.durable._private.checkpoint import Checkpoint, FileEntry
from elastrain.durable._private.errors import CheckpointCorruptedError

StagingMode = Literal["copy", "link", "move"]
STAGING_MODES = ("copy", "link", "move")
_CHUNK = 8 << 20
_HASH_THREADS = 4


def list_files(local_dir: Path) -> list[Path]:
    """Every file under ``local_dir`` (symlinks followed), sorted; empty folders have nothing to keep."""
    return sorted(path for path in local_dir.rglob("*") if path.is_file())


def stage(local_dir: Path, staged_dir: Path, mode: StagingMode) -> None:
    """Put ``local_dir``'s files under ``staged_dir``, as fast as the filesystem allows (hashing comes later,
    off the training path).

    ``copy`` lets the kernel copy (``copy_file_range``/``sendfile``; a reflink where the filesystem has them).
    ``link`` hard-links (instant; the caller must not rewrite those files in place until the upload is done)
    and falls back to copying across filesystems. ``move`` hands the folder over.
    """
    if mode == "move":
        shutil.move(str(local_dir), str(staged_dir))
        return
    for source in list_files(local_dir):
        target = staged_dir / source.relative_to(local_dir)
        target.parent.mkdir(parents=True, exist_ok=True)
        if mode == "link":
            try:
                os.link(source, target)
                continue
            except OSError:
                pass  # another filesystem, or links not allowed: copy
        shutil.copyfile(source, target)


def describe(local_dir: Path) -> list[FileEntry]:
    """Sizes and SHA-256 of every file under ``local_dir`` (hashed in parallel: hashlib releases the GIL)."""
    paths = list_files(local_dir)
    with concurrent.futures.ThreadPoolExecutor(_HASH_THREADS, thread_name_prefix="elastrain-hash") as pool:
        digests = list(pool.map(hash_file, paths))
    return [_describe(local_dir, path, digest) for path, digest in zip(paths, digests, strict=True)]


def hash_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as reader:
        while chunk := reader.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _describe(root: Path, path: Path, sha256: str) -> FileEntry:
    return FileEntry(path.relative_to(root).as_posix(), path.stat().st_size, sha256)


def verify_folder(folder: Path, checkpoint: Checkpoint) -> None:
    """Check a downloaded folder against its manifest; files the manifest does not name are removed."""
    expected = {entry.path: entry for entry in checkpoint.files}
    found: list[tuple[Path, FileEntry]] = []
    for path in list_files(folder):
        relative = path.relative_to(folder).as_posix()
        entry = expected.pop(relative, None)
        if entry is None:
            path.unlink()  # not part of the checkpoint: the restored folder holds exactly its files
            continue
        size = path.stat().st_size
        if size != entry.size:
            raise CheckpointCorruptedError(
                f"{checkpoint.uri} is corrupted: {relative} has {size} bytes, its manifest says {entry.size}."
            )
        found.append((path, entry))
    if expected:
        raise CheckpointCorruptedError(
            f"{checkpoint.uri} is corrupted: {len(expected)} file(s) missing, e.g. {sorted(expected)[0]}."
        )
    with concurrent.futures.ThreadPoolExecutor(_HASH_THREADS, thread_name_prefix="elastrain-hash") as pool:
        digests = list(pool.map(hash_file, [path for path, _ in found]))
    for (_, entry), digest in zip(found, digests, strict=True):
        if digest != entry.sha256:
            raise CheckpointCorruptedError(f"{checkpoint.uri} is corrupted: {entry.path} fails its SHA-256 check.")
