"""The one walk over a checkpoint folder: staging, checksums, uploads and restores all see the same files.

Symbolic links are followed (a checkpoint that links to shared weights saves their content); a link that points
nowhere, or a folder that links back into itself, is refused with an error naming it, rather than skipped.
"""

from __future__ import annotations

import os
import stat


def walk_files(top: str | os.PathLike[str]) -> list[tuple[str, str]]:
    """``(path, relative)`` for every file under ``top``, links followed, sorted by ``relative`` (``/``-separated).

    Empty folders have nothing to keep. Anything that is neither a file nor a folder (a socket, a FIFO) is
    refused: reading it could block forever.
    """
    root = os.fspath(top)
    found: list[tuple[str, str]] = []
    _visit(root, "", {_identity(os.stat(root))}, found)
    found.sort(key=lambda pair: pair[1])
    return found


def _visit(folder: str, prefix: str, ancestors: set[tuple[int, int]], found: list[tuple[str, str]]) -> None:
    with os.scandir(folder) as entries:
        for entry in entries:
            relative = prefix + entry.name
            try:
                info = os.stat(entry.path)  # follows links
            except FileNotFoundError:
                if os.path.islink(entry.path):
                    raise FileNotFoundError(
                        f"{entry.path!r} is a symbolic link to {os.readlink(entry.path)!r}, which does not exist; "
                        "remove the link or point it at a file before saving."
                    ) from None
                continue  # removed while walking
            if stat.S_ISDIR(info.st_mode):
                identity = _identity(info)
                if identity in ancestors:
                    raise ValueError(
                        f"{entry.path!r} links back to a folder that contains it; a checkpoint must be a finite "
                        "tree: replace the link with the files it should hold."
                    )
                _visit(entry.path, relative + "/", ancestors | {identity}, found)
            elif stat.S_ISREG(info.st_mode):
                found.append((entry.path, relative))
            else:
                raise ValueError(
                    f"{entry.path!r} is not a regular file (a FIFO, socket or device); checkpoints hold only files "
                    "and folders: move it out of the checkpoint folder."
                )


def _identity(info: os.stat_result) -> tuple[int, int]:
    return info.st_dev, info.st_ino


def download_targets(base: str, found: list[str], local_dir: str) -> list[tuple[str, str]]:
    """(object, local path) for each object under ``base``; a key that would land outside ``local_dir`` is
    refused (a crafted ``../`` key)."""
    pairs = []
    root = os.path.realpath(local_dir)
    for path in found:
        target = os.path.realpath(os.path.join(local_dir, *path[len(base) + 1 :].split("/")))
        if not target.startswith(root + os.sep):
            raise ValueError(f"Refusing to download {path!r}: its key points outside the target folder.")
        os.makedirs(os.path.dirname(target), exist_ok=True)
        pairs.append((path, target))
    return pairs
