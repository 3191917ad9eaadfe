"""What a committed checkpoint is: its files with sizes and checksums, metrics and step, kept in a manifest."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import secrets
from collections.abc import Mapping
from typing import Any

MANIFEST_FORMAT = 1
MANIFEST_DIR = "_manifests"  # one folder per committed checkpoint, holding its manifest only
MANIFEST_FILE = "MANIFEST.json"
_NAME = re.compile(r"^checkpoint_(\d{9})_([0-9a-f]{6})(\.partial-[0-9a-f]{8})?$")


@dataclasses.dataclass(frozen=True)
class FileEntry:
    """One file of a checkpoint: its path relative to the checkpoint's folder (``/``-separated)."""

    path: str
    size: int
    sha256: str


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """A committed checkpoint. Only ever made from a manifest that was written after all its files."""

    name: str
    uri: str  # where its files are, without credentials
    sequence: int  # increases with every upload a store starts (names sort by it; the order is order_key's)
    step: int | None
    metrics: Mapping[str, Any]
    created_at: float  # seconds since the epoch, when it was committed
    files: tuple[FileEntry, ...]

    @property
    def total_bytes(self) -> int:
        return sum(entry.size for entry in self.files)

    def __repr__(self) -> str:
        return (
            f"Checkpoint(name={self.name!r}, step={self.step!r}, metrics={dict(self.metrics)!r}, "
            f"files={len(self.files)}, bytes={self.total_bytes})"
        )


def new_name(sequence: int) -> str:
    """Names sort by sequence; the random suffix keeps two writers from ever sharing a folder."""
    return f"checkpoint_{sequence:09d}_{secrets.token_hex(3)}"


def sequence_of(name: str) -> int | None:
    """The sequence number of a checkpoint folder's name, or None for names this package did not write."""
    match = _NAME.match(name)
    return int(match.group(1)) if match else None


def checkpoint_name(name: str) -> str:
    """The checkpoint a folder belongs to: ``name`` without the suffix of a local copy in progress."""
    return name.split(".partial-", 1)[0]


def check_metrics(metrics: Mapping[str, Any] | None) -> dict[str, Any]:
    if metrics is None:
        return {}
    if not isinstance(metrics, Mapping) or not all(isinstance(key, str) for key in metrics):
        raise TypeError(f"metrics must be a dict with str keys, got {type(metrics).__name__}.")
    try:
        json.dumps(metrics)
    except (TypeError, ValueError) as error:
        raise TypeError(
            f"metrics must be JSON-serializable (numbers, strings, lists, dicts): {error}. Convert tensors with "
            ".item() first."
        ) from None
    return dict(metrics)


def encode_manifest(
    *, name: str, sequence: int, step: int | None, metrics: Mapping[str, Any], created_at: float, files: list[FileEntry]
) -> bytes:
    document = {
        "format": MANIFEST_FORMAT,
        "name": name,
        "sequence": sequence,
        "step": step,
        "metrics": dict(metrics),
        "created_at": created_at,
        "files": [dataclasses.asdict(entry) for entry in files],
    }
    return json.dumps(document, indent=1, sort_keys=True).encode()


def decode_manifest(data: bytes, uri: str) -> Checkpoint:
    """Parse a manifest; anything malformed raises ValueError (a torn or foreign file is not a checkpoint)."""
    document = json.loads(data)
    if not isinstance(document, dict) or document.get("format") != MANIFEST_FORMAT:
        raise ValueError(f"not a format-{MANIFEST_FORMAT} manifest")
    files = tuple(
        FileEntry(str(entry["path"]), int(entry["size"]), str(entry["sha256"])) for entry in document["files"]
    )
    step = document.get("step")
    return Checkpoint(
        name=str(document["name"]),
        uri=uri,
        sequence=int(document["sequence"]),
        step=None if step is None else int(step),
        metrics=dict(document.get("metrics") or {}),
        created_at=float(document["created_at"]),
        files=files,
    )


def order_key(checkpoint: Checkpoint) -> tuple[bool, int, int, str]:
    """Checkpoints are ordered by step, the state's own progress, then by the order their saves began; ones
    saved without a step come before those with one. Not by upload order alone: after an elastic reset the
    former rank 0 may still be uploading an older state while the new one commits a newer."""
    return (checkpoint.step is not None, checkpoint.step or 0, checkpoint.sequence, checkpoint.name)


def score_key(checkpoint: Checkpoint, attribute: str, order: str) -> tuple[int, float]:
    """Sort key, larger is better; a missing, non-numeric or NaN score is the worst in either order."""
    value = checkpoint.metrics.get(attribute)
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        return (0, 0.0)
    return (1, float(value) if order == "max" else -float(value))


def checkpoints_to_keep(
    checkpoints: list[Checkpoint], num_to_keep: int | None, score_attribute: str | None, score_order: str
) -> list[Checkpoint]:
    """The ones garbage collection keeps, in order: the latest always, then the best by score (or the newest)."""
    ordered = sorted(checkpoints, key=order_key)
    if num_to_keep is None or len(ordered) <= num_to_keep:
        return ordered
    latest, rest = ordered[-1], ordered[:-1]
    if score_attribute is None:
        ranked = sorted(rest, key=order_key, reverse=True)
    else:
        # Ties go to the newer checkpoint.
        ranked = sorted(rest, key=lambda c: (score_key(c, score_attribute, score_order), order_key(c)), reverse=True)
    kept = {c.name for c in ranked[: num_to_keep - 1]} | {latest.name}
    return [c for c in ordered if c.name in kept]
