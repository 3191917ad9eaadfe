"""A client that runs the user's own commands (``aws s3 sync``, ``gsutil rsync``, ``rclone``...).

Templates are split into arguments once, up front, and the paths are put into those arguments: no shell ever
reads a path, so a path cannot inject a command. Compound commands go through an explicit
``sh -c '...' {source} {target}`` whose script refers to ``"$0"`` and ``"$1"``.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import string
import subprocess

from elastrain.durable._private.errors import CommandFailedError, StorageTimeoutError
from elastrain.durable._private.location import redact
from elastrain.durable._private.sync_client import SyncClient

_STDERR_TAIL = 2000


class CommandSyncClient(SyncClient):
    """``sync_up``/``sync_down`` name ``{source}`` and ``{target}``; ``delete`` names ``{target}``.

    ``sync_up`` copies a local folder's files under a URI, ``sync_down`` a URI's files into a local folder,
    ``delete`` removes a URI and everything under it (nothing there must not fail). For example::

        CommandSyncClient(
            sync_up="aws s3 sync {source} {target}",
            sync_down="aws s3 sync {source} {target}",
            delete="aws s3 rm --recursive {target}",
        )
    """

    def __init__(self, sync_up: str, sync_down: str, delete: str) -> None:
        self.sync_up = _parse("sync_up", sync_up, ("source", "target"))
        self.sync_down = _parse("sync_down", sync_down, ("source", "target"))
        self.delete_command = _parse("delete", delete, ("target",))

    def __repr__(self) -> str:
        return f"CommandSyncClient(sync_up={self.sync_up[0]!r}, sync_down={self.sync_down[0]!r}, ...)"

    def upload(self, local_dir: str, uri: str, *, timeout_s: float) -> None:
        self._run(self.sync_up, {"source": local_dir, "target": uri}, timeout_s)

    def download(self, uri: str, local_dir: str, *, timeout_s: float) -> None:
        self._run(self.sync_down, {"source": uri, "target": local_dir}, timeout_s)

    def delete(self, uri: str, *, timeout_s: float) -> None:
        self._run(self.delete_command, {"target": uri}, timeout_s)

    def _run(self, template: list[str], values: dict[str, str], timeout_s: float) -> None:
        argv = [argument.format(**values) for argument in template]
        # A session of its own, so that a timeout kills the command and anything it started.
        process = subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True
        )
        try:
            _, stderr = process.communicate(timeout=max(timeout_s, 0.001))
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            raise StorageTimeoutError(
                f"Command {argv[0]!r} did not finish within its deadline of {timeout_s:.1f} s; it was killed."
            ) from None
        if process.returncode != 0:
            tail = (stderr or "").strip()[-_STDERR_TAIL:]
            # Only the program is named: the rest of a command line may carry credentials.
            raise CommandFailedError(
                f"Command {argv[0]!r} exited with status {process.returncode}: {redact(tail, ()) or '(no output)'}"
            )


def _parse(option: str, template: str, required: tuple[str, ...]) -> list[str]:
    """Split and check a template; every problem names the option and what to write instead."""
    if not isinstance(template, str) or not template.strip():
        raise ValueError(f"{option} must be a command template such as 'aws s3 sync {{source}} {{target}}'.")
    try:
        argv = shlex.split(template)
    except ValueError as error:
        raise ValueError(f"{option} template {template!r} cannot be split into arguments: {error}.") from None
    fields: set[str] = set()
    for argument in argv:
        try:
            parsed = list(string.Formatter().parse(argument))
        except ValueError as error:
            raise ValueError(f"{option} template {template!r}: {error} (write {{{{ and }}}} for braces).") from None
        for _, field, spec, conversion in parsed:
            if field is None:
                continue
            if field not in required or spec or conversion:
                raise ValueError(
                    f"{option} template {template!r} uses {{{field}}}; it may use only "
                    f"{', '.join('{' + name + '}' for name in required)}."
                )
            fields.add(field)
    missing = [name for name in required if name not in fields]
    if missing:
        raise ValueError(f"{option} template {template!r} must contain {', '.join('{' + m + '}' for m in missing)}.")
    if "{" in argv[0]:
        raise ValueError(f"{option} template {template!r} must start with a command, not a placeholder.")
    if shutil.which(argv[0]) is None:
        raise ValueError(f"{option} command {argv[0]!r} is not on PATH; install it or give its full path.")
    return argv
