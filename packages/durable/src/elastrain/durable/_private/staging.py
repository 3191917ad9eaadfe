"""Staging: a private copy of a checkpoint's files, taken before the upload so training can go on writing."""

from __future__ import annotations

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


def list_files(local_dir: Path) -> list[Path]:
    """Every file under ``local_dir`` (symlinks followed), sorted; empty folders have nothing to keep."""
    return sorted(path for path in local_dir.rglob("*") if path.is_file())


def stage(local_dir: Path, staged_dir: Path, mode: StagingMode) -> list[FileEntry]:
    """Put ``local_dir``'s files under ``staged_dir`` and describe them (sizes, SHA-256).

    ``copy`` reads each file once, hashing while it copies. ``link`` hard-links (instant; the caller must not
    rewrite those files in place until the upload is done) and falls back to copying across filesystems.
    ``move`` hands the folder over.
    """
    if mode == "move":
        shutil.move(str(local_dir), str(staged_dir))
        return describe(staged_dir)
    entries = []
    for source in list_files(local_dir):
        target = staged_dir / source.relative_to(local_dir)
        target.parent.mkdir(parents=True, exist_ok=True)
        if mode == "link":
            try:
                os.link(source, target)
                entries.append(_describe(staged_dir, target, hash_file(target)))
                continue
            except OSError:
                pass  # another filesystem, or links not allowed: copy
        entries.append(_describe(staged_dir, target, copy_and_hash(source, target)))
    return entries


def describe(local_dir: Path) -> list[FileEntry]:
    """Describe the files where they are (for saves whose caller waits for the upload)."""
    return [_describe(local_dir, path, hash_file(path)) for path in list_files(local_dir)]


def copy_and_hash(source: Path, target: Path) -> str:
    digest = hashlib.sha256()
    with open(source, "rb") as reader, open(target, "wb") as writer:
        while chunk := reader.read(_CHUNK):
            digest.update(chunk)
            writer.write(chunk)
    return digest.hexdigest()


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
    for path in list_files(folder):
        relative = path.relative_to(folder).as_posix()
        if relative not in expected:
            path.unlink()  # not part of the checkpoint: the restored folder holds exactly its files
            continue
        entry = expected.pop(relative)
        size = path.stat().st_size
        if size != entry.size:
            raise CheckpointCorruptedError(
                f"{checkpoint.uri} is corrupted: {relative} has {size} bytes, its manifest says {entry.size}."
            )
        if hash_file(path) != entry.sha256:
            raise CheckpointCorruptedError(f"{checkpoint.uri} is corrupted: {relative} fails its SHA-256 check.")
    if expected:
        raise CheckpointCorruptedError(
            f"{checkpoint.uri} is corrupted: {len(expected)} file(s) missing, e.g. {sorted(expected)[0]}."
        )
