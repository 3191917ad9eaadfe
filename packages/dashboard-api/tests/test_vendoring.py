"""uPlot, vendored at build time by hatch_build.py: shipped at the pinned version with its license, checked
against the pinned sha512, and a clear error without the registry. No test here reaches the network."""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import io
import json
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from importlib import resources
from pathlib import Path
from types import ModuleType

import pytest

PACKAGE = Path(__file__).resolve().parent.parent
PIN = tomllib.loads((PACKAGE / "pyproject.toml").read_text())["tool"]["hatch"]["build"]["hooks"]["custom"]


def hatch_build() -> ModuleType:
    spec = importlib.util.spec_from_file_location("hatch_build", PACKAGE / "hatch_build.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def a_tarball(path: Path, script: bytes = b"var uPlot = function () {};") -> str:
    """An npm-style tarball holding what the hook takes; returns its integrity."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, content in [
            ("package/dist/uPlot.iife.min.js", script),
            ("package/dist/uPlot.min.css", b".uplot {}"),
            ("package/LICENSE", b"The MIT License (MIT)"),
            ("package/README.md", b"not taken"),
        ]:
            info = tarfile.TarInfo(name)
            info.size = len(content)
            archive.addfile(info, io.BytesIO(content))
    path.write_bytes(buffer.getvalue())
    return "sha512-" + base64.b64encode(hashlib.sha512(buffer.getvalue()).digest()).decode()


def test_the_installed_package_ships_the_pinned_uplot_with_its_license() -> None:
    folder = resources.files("elastrain.dashboard_api").joinpath("static", "uplot")
    stamp = json.loads(folder.joinpath("VENDORED.json").read_text())
    assert (stamp["version"], stamp["integrity"]) == (PIN["uplot-version"], PIN["uplot-integrity"])
    for name, digest in stamp["files"].items():
        assert hashlib.sha256(folder.joinpath(name).read_bytes()).hexdigest() == digest, name
    assert "MIT License" in folder.joinpath("LICENSE").read_text()
    assert "uPlot" in folder.joinpath("uPlot.iife.min.js").read_text()


def test_a_wheel_built_offline_from_the_vendored_files_ships_them(tmp_path: Path) -> None:
    """The files are git-ignored; the hook adds them to the build (here with no network: they are in place)."""
    build = "import sys; from hatchling.build import build_wheel; print(build_wheel(sys.argv[1]))"
    name = subprocess.run(
        [sys.executable, "-c", build, str(tmp_path)], cwd=PACKAGE, check=True, capture_output=True, text=True,
        env={"PATH": "/usr/bin:/bin", "https_proxy": "http://127.0.0.1:9", "HTTPS_PROXY": "http://127.0.0.1:9"},
    ).stdout.split()[-1]  # fmt: skip
    names = zipfile.ZipFile(tmp_path / name).namelist()
    for file in ("uPlot.iife.min.js", "uPlot.min.css", "LICENSE", "VENDORED.json"):
        assert f"elastrain/dashboard_api/static/uplot/{file}" in names
    for file in ("index.html", "page.js", "page.css"):
        assert f"elastrain/dashboard_api/static/{file}" in names


def test_the_hook_takes_a_checked_tarball_once(tmp_path: Path) -> None:
    hook = hatch_build()
    integrity = a_tarball(tmp_path / "uplot.tgz")
    target = tmp_path / "uplot"
    assert hook.vendor_uplot(target, "9.9.9", integrity, source=str(tmp_path / "uplot.tgz")) is True
    vendored = sorted(p.name for p in target.iterdir())
    assert vendored == ["LICENSE", "VENDORED.json", "uPlot.iife.min.js", "uPlot.min.css"]
    assert (target / "LICENSE").read_text() == "The MIT License (MIT)"
    # In place and matching the pin: nothing is read, not even a source that is not there.
    assert hook.vendor_uplot(target, "9.9.9", integrity, source=str(tmp_path / "gone.tgz")) is False
    # A changed file is fetched again.
    (target / "uPlot.iife.min.js").write_text("tampered")
    assert hook.vendor_uplot(target, "9.9.9", integrity, source=str(tmp_path / "uplot.tgz")) is True
    assert (target / "uPlot.iife.min.js").read_text() == "var uPlot = function () {};"


def test_the_hook_refuses_a_tarball_that_does_not_match_the_pin(tmp_path: Path) -> None:
    hook = hatch_build()
    pinned = a_tarball(tmp_path / "pinned.tgz")
    a_tarball(tmp_path / "other.tgz", script=b"var uPlot = 'something else';")
    with pytest.raises(RuntimeError, match="does not match the pinned integrity"):
        hook.vendor_uplot(tmp_path / "uplot", "9.9.9", pinned, source=str(tmp_path / "other.tgz"))
    assert not (tmp_path / "uplot").exists()
    with pytest.raises(RuntimeError, match="must be 'sha512-<base64>'"):
        hook.vendor_uplot(tmp_path / "uplot", "9.9.9", "sha1-abc", source=str(tmp_path / "pinned.tgz"))


def test_without_the_registry_the_hook_says_what_to_do(tmp_path: Path) -> None:
    hook = hatch_build()
    with pytest.raises(RuntimeError) as raised:
        hook.vendor_uplot(tmp_path / "uplot", "9.9.9", "sha512-AAAA", source="http://127.0.0.1:9/uplot-9.9.9.tgz")
    message = str(raised.value)
    assert "could not read http://127.0.0.1:9/uplot-9.9.9.tgz" in message
    assert "https://registry.npmjs.org/uplot/-/uplot-9.9.9.tgz" in message
    assert "ELASTRAIN_UPLOT_TARBALL" in message
