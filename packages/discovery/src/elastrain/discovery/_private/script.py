"""Discovery by running a user script that prints ``host:slots`` lines (Horovod's ``--host-discovery-script``)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from pathlib import Path

from elastrain.discovery._private.hosts import HostDiscovery, HostDiscoveryError
from elastrain.discovery._private.static import parse_host_spec
from elastrain.discovery._private.validation import check_positive, check_slot_count

_STDERR_TAIL_CHARS = 2000


class ScriptHostDiscovery(HostDiscovery):
    """Runs ``path`` on every poll and reads one ``host:slots`` line per available host from its stdout.

    A bare ``host`` line takes ``default_slots`` (an error when that is not set). Blank lines and ``#``
    comments are ignored. A script that runs past ``timeout_s``, exits non-zero or prints a malformed line
    raises :class:`HostDiscoveryError` naming the script and what went wrong.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        timeout_s: float = 10.0,
        default_slots: int | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise ValueError(f"Host discovery script {str(self.path)!r} does not exist or is not a file.")
        if not os.access(self.path, os.X_OK):
            raise ValueError(f"Host discovery script {str(self.path)!r} is not executable; run `chmod +x {self.path}`.")
        check_positive("timeout_s", timeout_s)
        if default_slots is not None:
            check_slot_count("default_slots", default_slots, source="ScriptHostDiscovery")
        self.timeout_s = timeout_s
        self.default_slots = default_slots
        self._env = None if env is None else {**os.environ, **env}

    def __repr__(self) -> str:
        return f"ScriptHostDiscovery({str(self.path)!r}, timeout_s={self.timeout_s})"

    def find_available_hosts_and_slots(self) -> dict[str, int]:
        try:
            done = subprocess.run(
                [str(self.path.resolve())],
                capture_output=True,
                text=True,
                timeout=self.timeout_s,
                env=self._env,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise HostDiscoveryError(
                f"Host discovery script {str(self.path)!r} did not finish within {self.timeout_s} s; "
                "make it faster or raise timeout_s."
            ) from None
        except OSError as error:
            raise HostDiscoveryError(f"Could not run host discovery script {str(self.path)!r}: {error}") from error
        if done.returncode != 0:
            stderr = done.stderr.strip()[-_STDERR_TAIL_CHARS:]
            raise HostDiscoveryError(
                f"Host discovery script {str(self.path)!r} exited with status {done.returncode}"
                + (f"; its stderr ends with:\n{stderr}" if stderr else " and printed nothing on stderr.")
            )
        try:
            hosts = parse_host_spec(
                done.stdout, source=f"output of {str(self.path)!r}", default_slots=self.default_slots
            )
        except ValueError as error:
            raise HostDiscoveryError(str(error)) from None
        return {host: slots for host, slots in hosts.items() if slots > 0}
