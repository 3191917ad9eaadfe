"""Garbage collection and the bookkeeping it needs: which uploads are unfinished, and which are still going.

An upload first writes a small marker, ``_pending/<checkpoint>.json``, holding when it started and how long it
may take; the commit removes it. Collection treats a checkpoint folder as abandoned only when its marker is
older than that deadline (its writer is gone; a slow one still running is left alone), or, where listing the
store's root is cheap, when it has neither a manifest nor a marker and is older than the commit that runs the
collection. Listing ``_pending`` instead of the root keeps clients without a cheap listing (commands) from
copying the whole store to find out what is in it.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

from elastrain.durable._private import checkpoint as ckpt
from elastrain.durable._private.location import Location
from elastrain.durable._private.readers import Readers
from elastrain.durable._private.sync_client import SyncClient

logger = logging.getLogger("elastrain.durable")
PENDING_DIR = "_pending"
# A marker outlives its upload's deadline by this much before its folder counts as abandoned.
_PENDING_MARGIN_S = 300.0


class Collector:
    def __init__(
        self,
        location: Location,
        client: SyncClient,
        retry: Callable[..., Any],
        list_names: Callable[..., list[str]],
        readers: Readers,
    ) -> None:
        self.location = location
        self.client = client
        self.retry = retry
        self.list_names = list_names
        self.readers = readers
        # Clients that override list_names list a folder cheaply; the default one downloads the folder.
        self.cheap_root_listing = type(client).list_names is not SyncClient.list_names

    # -- markers ---------------------------------------------------------------------------------------------

    def mark_pending(self, name: str, deadline_s: float, deadline: float) -> None:
        """``deadline_s``: the whole save's; the save itself gives up by ``deadline`` (monotonic), within it."""
        document = json.dumps({"started_at": time.time(), "deadline_s": deadline_s}).encode()
        uri = self._marker(name)
        self.retry(
            lambda left: self.client.write_bytes(uri, document, timeout_s=left), "marking an upload", deadline=deadline
        )

    def clear_pending(self, name: str) -> None:
        try:
            self._delete_file(self._marker(name))
        except Exception as error:  # a leftover marker of a committed checkpoint is removed by collection
            logger.info("Could not remove the upload marker of %s (%s).", name, type(error).__name__)

    def highest_sequence(self, deadline: float) -> int:
        """The highest sequence committed, being uploaded, or (where cheap to list) present at all."""
        names = self.list_names(self.location.join(ckpt.MANIFEST_DIR), deadline=deadline)
        names += list(self.list_markers(deadline))
        if self.cheap_root_listing:
            names += self.list_names(self.location.root, deadline=deadline)
        return max((s for s in map(ckpt.sequence_of, names) if s is not None), default=0)

    def list_root(self) -> list[str] | None:
        """The names at the store's root, where listing it is cheap (None elsewhere)."""
        return self.list_names(self.location.root) if self.cheap_root_listing else None

    def list_markers(self, deadline: float | None = None) -> dict[str, str]:
        """Checkpoint name -> marker file name, for every upload marker."""
        listed = self.list_names(self.location.join(PENDING_DIR), deadline=deadline)
        return {_name_of_marker(marker): marker for marker in listed}

    # -- collection ------------------------------------------------------------------------------------------

    def collect(
        self,
        doomed: list[str],
        committed_sequence: int,
        failed: set[str],
        manifests: set[str],
        markers: dict[str, str],
        root: list[str] | None,
        uncommitted: set[str],
    ) -> None:
        """Delete ``doomed`` committed checkpoints (manifest first), then abandoned uploads: those whose marker
        is past its deadline, and ``failed`` (uploads of this store that failed; removed from the set once gone).
        ``manifests``: the names under ``_manifests`` (unreadable ones too: their files are never collected),
        listed after ``markers`` and ``root`` (``list_markers``, ``list_root``). ``uncommitted``: listed there
        but holding no manifest, the folder of an uncommit cut short (its collector died between the two deletes);
        one with an upload marker may be a commit being written, so only the others are finished off here.
        """
        abandoned = self._abandoned(manifests, markers, committed_sequence, root)
        failed.difference_update(manifests)  # committed after all (a late write): not this store's to collect
        abandoned += [name for name in sorted(failed) if name not in abandoned]
        unfinished = uncommitted - markers.keys()
        abandoned = [name for name in abandoned if name not in unfinished]
        if not doomed and not abandoned and not unfinished and not (markers.keys() & manifests):
            return
        busy = self.readers.busy()
        for name in sorted(unfinished - busy):
            # Look again, marker first: a writer leaves its marker until its manifest is whole, so a folder with
            # neither is not a commit being written (on a local path its folder exists just before its file).
            if self._marked_now(name) or self._committed_now(name):
                continue
            self._delete(self.location.join(ckpt.MANIFEST_DIR, name))
            self._delete_folder(name)
            logger.info("Collected %s (an earlier collection of it was cut short).", self.location.display_join(name))
        for name in doomed:
            if name in busy:
                continue  # a restore reads it: a later collection takes it
            self._delete(self.location.join(ckpt.MANIFEST_DIR, name))  # uncommit first
            if name in self.readers.busy():
                # A reader leased it between the two looks: leave its files, marked abandoned for later.
                self._write_abandoned_marker(name)
                continue
            self._delete_folder(name)
            logger.info("Collected %s.", self.location.display_join(name))
        for name in abandoned:
            if name in busy or (name == ckpt.checkpoint_name(name) and self._committed_now(name)):
                continue  # committed since the listings (a writer past its deadline still finished)
            self._delete_folder(name)
            if name in markers:
                self._delete_file(self._marker_uri(markers[name]))
            failed.discard(name)
            logger.info("Removed unfinished upload %s.", self.location.display_join(name))
        for name in markers.keys() & manifests:  # committed, but its marker was left behind
            self._delete_file(self._marker_uri(markers[name]))

    def _abandoned(
        self, manifests: set[str], markers: dict[str, str], committed_sequence: int, root: list[str] | None
    ) -> list[str]:
        found = []
        now = time.time()
        for name, marker in markers.items():
            if name in manifests:
                continue
            started_at, deadline_s = self._read_marker(marker)
            if now - started_at > deadline_s + _PENDING_MARGIN_S:
                found.append(name)
        if root is not None:
            for name in root:
                sequence = ckpt.sequence_of(name)
                checkpoint = ckpt.checkpoint_name(name)  # a local copy in progress carries a suffix
                if sequence is None or name in manifests or checkpoint in markers or name in found:
                    continue
                if sequence < committed_sequence:  # a writer that died before it could even leave a marker
                    found.append(name)
        return found

    def _read_marker(self, marker: str) -> tuple[float, float]:
        uri = self._marker_uri(marker)
        try:
            data = self.retry(lambda left: self.client.read_bytes(uri, timeout_s=left), "reading an upload marker")
            document = json.loads(data)
            return float(document["started_at"]), float(document["deadline_s"])
        except FileNotFoundError:
            return time.time(), float("inf")  # just committed or removed: not abandoned
        except (ValueError, KeyError, TypeError):
            return 0.0, 0.0  # unreadable: abandoned

    def _committed_now(self, name: str) -> bool:
        return self._exists_now(self.location.join(ckpt.MANIFEST_DIR, name, ckpt.MANIFEST_FILE), "checking a manifest")

    def _marked_now(self, name: str) -> bool:
        return self._exists_now(self._marker(name), "checking an upload marker")

    def _exists_now(self, uri: str, what: str) -> bool:
        """Read afresh (not from a listing taken earlier): whether the small file is there at this moment."""
        try:
            self.retry(lambda left: self.client.read_bytes(uri, timeout_s=left), what)
        except FileNotFoundError:
            return False
        return True

    def _delete_folder(self, name: str) -> None:
        self._delete(self.location.join(name))
        abort = getattr(self.client, "_abort_open_uploads", None)  # S3: parts of uploads left open are billed
        if abort is None:
            return
        try:
            self.retry(lambda left: abort(self.location.join(name), timeout_s=left), "aborting open uploads")
        except Exception as error:  # e.g. no s3:ListBucketMultipartUploads permission: collection goes on
            logger.info("Could not look for open uploads under %s (%s).", name, type(error).__name__)

    def mark_abandoned(self, name: str) -> None:
        """Have the next collection remove ``name``'s files (an uncommitted checkpoint)."""
        self._write_abandoned_marker(name)

    def _write_abandoned_marker(self, name: str) -> None:
        document = json.dumps({"started_at": 0.0, "deadline_s": 0.0}).encode()
        uri = self._marker(name)
        self.retry(lambda left: self.client.write_bytes(uri, document, timeout_s=left), "marking an abandoned upload")

    def _marker(self, name: str) -> str:
        return self._marker_uri(f"{name}.json")

    def _marker_uri(self, marker: str) -> str:
        return self.location.join(PENDING_DIR, marker)

    def _delete(self, uri: str) -> None:
        self.retry(lambda left: self.client.delete(uri, timeout_s=left), "deleting a checkpoint")

    def _delete_file(self, uri: str) -> None:
        self.retry(lambda left: self.client.delete_file(uri, timeout_s=left), "deleting an upload marker")


def _name_of_marker(marker: str) -> str:
    return marker[: -len(".json")] if marker.endswith(".json") else marker
