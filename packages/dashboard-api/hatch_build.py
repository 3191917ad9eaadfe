"""Build hook: vendor uPlot, the page's chart library, from the npm registry into the package.

hatchling runs it for every build: wheels, sdists and editable installs (``pip install -e``). The version and
its sha512 (the registry's ``dist.integrity`` for it) are pinned in pyproject.toml under
``[tool.hatch.build.hooks.custom]``. The tarball is checked against that hash before anything is taken from it,
and three files go to ``src/elastrain/dashboard_api/static/uplot/`` (git-ignored): the minified browser build,
its stylesheet and uPlot's MIT license. A stamp there records the pin and each file's sha256; while it matches,
builds need no network. ``ELASTRAIN_UPLOT_TARBALL`` names a local copy of the tarball (or another URL) for
builds without access to registry.npmjs.org; it is checked against the same hash.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import io
import json
import os
import tarfile
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

TARGET = Path("src/elastrain/dashboard_api/static/uplot")
STAMP = "VENDORED.json"
TARBALL_ENV = "ELASTRAIN_UPLOT_TARBALL"
# Tarball member -> file name in TARGET.
MEMBERS = {
    "package/dist/uPlot.iife.min.js": "uPlot.iife.min.js",
    "package/dist/uPlot.min.css": "uPlot.min.css",
    "package/LICENSE": "LICENSE",
}
MAX_TARBALL_BYTES = 16 * 2**20  # uPlot's is ~0.2 MB; a bound keeps a wrong URL from filling memory
DOWNLOAD_TIMEOUT_S = 60


class VendorUplotHook(BuildHookInterface):  # type: ignore[type-arg]
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        target = Path(self.root) / TARGET
        vendor_uplot(target, self.config["uplot-version"], self.config["uplot-integrity"])
        # The files are git-ignored, which hatchling would otherwise leave out of wheels and sdists.
        build_data["artifacts"].extend(f"/{TARGET.as_posix()}/{name}" for name in [*MEMBERS.values(), STAMP])


def tarball_url(version: str) -> str:
    return f"https://registry.npmjs.org/uplot/-/uplot-{version}.tgz"


def vendor_uplot(target: Path, version: str, integrity: str, source: str | None = None) -> bool:
    """Place uPlot ``version`` in ``target`` unless the files there already match the pin; True when it fetched.

    ``source``: a path or URL of the tarball (default: ``$ELASTRAIN_UPLOT_TARBALL``, else the npm registry).
    """
    stamp = {"package": "uplot", "version": version, "integrity": integrity}
    if _vendored(target, stamp):
        return False
    source = source or os.environ.get(TARBALL_ENV) or tarball_url(version)
    data = _read(source, version)
    _check_integrity(data, integrity, source)
    files = _extract(data, source)
    target.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        _write_atomically(target / name, content)
    stamp["files"] = {name: hashlib.sha256(content).hexdigest() for name, content in files.items()}
    # Written last: an interrupted vendoring leaves no stamp, so the next build fetches again.
    _write_atomically(target / STAMP, (json.dumps(stamp, indent=2) + "\n").encode())
    return True


def _vendored(target: Path, wanted: dict[str, str]) -> bool:
    try:
        stamp = json.loads((target / STAMP).read_text())
        if {key: stamp.get(key) for key in wanted} != wanted or set(stamp["files"]) != set(MEMBERS.values()):
            return False
        return all(
            hashlib.sha256((target / name).read_bytes()).hexdigest() == digest
            for name, digest in stamp["files"].items()
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def _read(source: str, version: str) -> bytes:
    try:
        if "://" not in source:
            with open(source, "rb") as file:
                data = file.read(MAX_TARBALL_BYTES + 1)
        else:
            with urllib.request.urlopen(source, timeout=DOWNLOAD_TIMEOUT_S) as response:  # noqa: S310 - https or file
                data = response.read(MAX_TARBALL_BYTES + 1)
    except (OSError, urllib.error.URLError) as error:
        raise RuntimeError(
            f"elastrain-dashboard-api vendors uPlot {version} (its page's charts) at build time, and could not read "
            f"{source}: {error}. Build once where registry.npmjs.org is reachable (the files are then kept in "
            f"{TARGET}), or fetch {tarball_url(version)} elsewhere and set {TARBALL_ENV} to its path; it is "
            "checked against the pinned sha512 either way."
        ) from error
    if len(data) > MAX_TARBALL_BYTES:
        raise RuntimeError(f"{source} is larger than {MAX_TARBALL_BYTES} bytes: not uPlot's npm tarball.")
    return data


def _check_integrity(data: bytes, integrity: str, source: str) -> None:
    """``integrity`` in npm's Subresource Integrity form, ``sha512-<base64 digest>``."""
    algorithm, _, expected = integrity.partition("-")
    if algorithm != "sha512" or not expected:
        raise RuntimeError(f"uplot-integrity must be 'sha512-<base64>' (npm's dist.integrity), got {integrity!r}.")
    actual = base64.b64encode(hashlib.sha512(data).digest()).decode()
    if not hmac.compare_digest(actual, expected):
        raise RuntimeError(
            f"{source} does not match the pinned integrity: expected sha512-{expected}, got sha512-{actual}. "
            "Nothing was vendored. A changed pin needs uplot-integrity from https://registry.npmjs.org/uplot/<version>."
        )


def _extract(data: bytes, source: str) -> dict[str, bytes]:
    files: dict[str, bytes] = {}
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
        for member, name in MEMBERS.items():
            try:
                info = archive.getmember(member)
            except KeyError:
                raise RuntimeError(f"{source} has no {member}: not uPlot's npm tarball.") from None
            extracted = archive.extractfile(info) if info.isfile() else None
            if extracted is None:
                raise RuntimeError(f"{member} in {source} is not a regular file.")
            files[name] = extracted.read()
    return files


def _write_atomically(path: Path, content: bytes) -> None:
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(handle, "wb") as file:
            file.write(content)
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
