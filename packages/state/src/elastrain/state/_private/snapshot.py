"""The state actor's snapshot: every run as one JSON document, replaced whole, never seen half-written.

Local paths are written to a temporary name, fsynced and renamed; other fsspec URIs (``s3://...``) are written
with one PUT, which object stores show only once complete.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from typing import Any

from elastrain.state._private.schemas import SCHEMA_VERSION, TrainRunInfo, migrate

SNAPSHOT_FILE = "runs.json"


class Snapshots:
    def __init__(self, uri: str) -> None:
        self.uri = uri.rstrip("/")
        self.local = "://" not in uri or uri.startswith("file://")
        self.path = (self.uri[len("file://") :] if self.uri.startswith("file://") else self.uri) + "/" + SNAPSHOT_FILE
        self.last_write_s: float | None = None  # how long the last snapshot took
        if self.local:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)

    def load(self) -> list[TrainRunInfo]:
        data = self._read()
        if data is None:
            return []
        document = json.loads(data)
        return [TrainRunInfo.model_validate(migrate(run)) for run in document.get("runs", [])]

    def write(self, runs: list[str]) -> None:
        """Write every run, given as its JSON document (as the state actor keeps them: no model is rebuilt)."""
        started = time.perf_counter()
        header = json.dumps({"schema_version": SCHEMA_VERSION, "written_at": time.time()}, separators=(",", ":"))
        data = f'{header[:-1]},"runs":[{",".join(runs)}]}}'.encode()
        if self.local:
            temporary = f"{self.path}.{uuid.uuid4().hex}.tmp"
            with open(temporary, "wb") as writer:
                writer.write(data)
                writer.flush()
                os.fsync(writer.fileno())
            os.replace(temporary, self.path)
        else:
            self._filesystem().pipe_file(self.path, data)
        self.last_write_s = time.perf_counter() - started

    def _read(self) -> bytes | None:
        if self.local:
            try:
                with open(self.path, "rb") as reader:
                    return reader.read()
            except FileNotFoundError:
                return None
        fs = self._filesystem()
        try:
            data: bytes = fs.cat_file(self.path)
        except FileNotFoundError:
            return None
        return data

    def _filesystem(self) -> Any:
        import fsspec

        filesystem, _ = fsspec.core.url_to_fs(self.uri)
        return filesystem
