"""Versions, sibling bounds, change fragments and the package index: what `nox -s release`, `nox -s index` and
lint's repository checks share. Standard library, git and `packaging` only.

Each distribution's version lives in its `_version.py` and is the version it last released (or will first
release); its CHANGELOG.md dates every released section; changes not yet released are towncrier fragments in its
`changes/` folder (docs/releasing.md). The commit `release: <dist> <version>` marks the last release (or, for
one made by hand, the last change of `_version.py`), so the fragment check needs no tags.
"""

from __future__ import annotations

import datetime
import hashlib
import html
import re
import shutil
import subprocess
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

ROOT = Path(__file__).resolve().parent.parent
FRAGMENT_TYPES = ("added", "changed", "deprecated", "removed", "fixed", "security")
CHANGELOG_START = "<!-- towncrier release notes start -->"
_VERSION_LINE = re.compile(r'^__version__ = "([^"]+)"$', re.MULTILINE)
_SEMVER = re.compile(r"^\d+\.\d+\.\d+((a|b|rc)\d+)?$")


@dataclass(frozen=True)
class Package:
    folder: str  # under packages/
    dist: str  # the distribution's name

    @property
    def path(self) -> Path:
        return ROOT / "packages" / self.folder

    @property
    def module(self) -> str:
        return "elastrain." + self.folder.replace("-", "_")

    @property
    def version_file(self) -> Path:
        return self.path / "src" / "elastrain" / self.folder.replace("-", "_") / "_version.py"

    @property
    def changes(self) -> Path:
        return self.path / "changes"

    @property
    def version(self) -> Version:
        match = _VERSION_LINE.search(self.version_file.read_text())
        if match is None:
            raise ValueError(f'{self.version_file} has no line __version__ = "X.Y.Z".')
        return Version(match.group(1))

    @property
    def tag(self) -> str:
        return f"{self.folder}-v{self.version}"

    def requirements(self) -> list[Requirement]:
        """Every requirement it declares, its extras' included."""
        project: dict[str, Any] = tomllib.loads((self.path / "pyproject.toml").read_text())["project"]
        listed = list(project.get("dependencies", []))
        for extra in project.get("optional-dependencies", {}).values():
            listed += extra
        return [Requirement(text) for text in listed]

    def fragments(self) -> list[Path]:
        if not self.changes.is_dir():
            return []
        return sorted(p for p in self.changes.iterdir() if p.suffix == ".md" and p.name != "README.md")

    def released_versions(self) -> list[Version]:
        """The versions its CHANGELOG.md dates (``## 0.1.0 — 2026-12-05``)."""
        text = (self.path / "CHANGELOG.md").read_text()
        found = re.findall(r"^## (\S+) — \d{4}-\d{2}-\d{2}$", text, re.MULTILINE)
        return sorted(Version(v) for v in found)


def packages() -> list[Package]:
    found = []
    for folder in sorted(p for p in (ROOT / "packages").iterdir() if (p / "pyproject.toml").is_file()):
        name = tomllib.loads((folder / "pyproject.toml").read_text())["project"]["name"]
        found.append(Package(folder.name, name))
    return found


def by_dist() -> dict[str, Package]:
    return {canonicalize_name(p.dist): p for p in packages()}


# -- bounds -----------------------------------------------------------------------------------------------------


def bound_problems() -> list[str]:
    """Every requirement on a sibling has a floor and a ceiling, and admits the sibling's version in this checkout."""
    siblings = by_dist()
    found = []
    for package in packages():
        for requirement in package.requirements():
            sibling = siblings.get(canonicalize_name(requirement.name))
            if sibling is None:
                continue
            operators = {spec.operator for spec in requirement.specifier}
            where = f"packages/{package.folder}/pyproject.toml requires {requirement}"
            if not operators & {">=", "==", "~="} or not operators & {"<", "==", "~="}:
                found.append(
                    f"{where}: give it a floor and a ceiling, e.g. {sibling.dist}>={_minor(sibling.version)},"
                    f"<{_next_breaking(sibling.version)} (docs/releasing.md)."
                )
            elif not requirement.specifier.contains(sibling.version, prereleases=True):
                found.append(
                    f"{where}, which does not admit {sibling.dist} {sibling.version} in this checkout: run "
                    f"{package.folder}'s tests against it, then widen the range."
                )
    return found


def _minor(version: Version) -> str:
    return f"{version.major}.{version.minor}"


def _next_breaking(version: Version) -> str:
    """The first version SemVer lets break this one's API: the next minor while 0.x, the next major after."""
    return f"0.{version.minor + 1}" if version.major == 0 else f"{version.major + 1}"


# -- fragments --------------------------------------------------------------------------------------------------


GIT = shutil.which("git") or "git"


def git(*args: str) -> str:
    return subprocess.run([GIT, *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout.strip()


def fragment_problems() -> list[str]:
    """A package whose src/ changed since its version last changed needs a fragment saying what changed."""
    try:
        git("rev-parse", "--git-dir")
    except (OSError, subprocess.CalledProcessError):
        return []  # not a checkout (an sdist): nothing to compare with
    found = []
    for package in packages():
        if not package.released_versions():
            continue  # before its first release, its changelog's unreleased section is the record
        # The release commit (`nox -s release` makes it), else the last change of the version, for releases made
        # by hand. A first release may leave _version.py as it was, so the commit is the surer mark.
        relative = package.version_file.relative_to(ROOT)
        release = git(
            "log", "-1", "--format=%H", f"--grep=^release: {package.dist} ", "--", f"packages/{package.folder}"
        )
        release = release or git("log", "-1", "--format=%H", "--", str(relative))
        if not release:
            continue  # not committed yet
        source = f"packages/{package.folder}/src"
        changed = git("diff", "--name-only", release, "--", source).splitlines()
        changed += git("ls-files", "--others", "--exclude-standard", "--", source).splitlines()
        found += [problem for p in package.fragments() if (problem := fragment_name_problem(p))]
        if changed and not package.fragments():
            found.append(
                f"packages/{package.folder}/src changed since {package.dist} {package.version} ({changed[0]}"
                f"{f' and {len(changed) - 1} more' if len(changed) > 1 else ''}), and packages/{package.folder}/"
                "changes/ holds no fragment: add one saying what changed for its users, e.g. "
                f"packages/{package.folder}/changes/+short-name.fixed.md (docs/releasing.md)."
            )
    return found


def fragment_name_problem(path: Path) -> str | None:
    """Fragments are ``<issue>.<type>.md`` or ``+<name>.<type>.md`` (a change with no issue)."""
    parts = path.name.split(".")
    if len(parts) == 3 and parts[1] in FRAGMENT_TYPES and (parts[0].isdigit() or parts[0].startswith("+")):
        return None
    return (
        f"{path.relative_to(ROOT)}: name a fragment <issue>.<type>.md or +<name>.<type>.md, its type one of "
        f"{', '.join(FRAGMENT_TYPES)}."
    )


# -- versions ---------------------------------------------------------------------------------------------------


def check_new_version(package: Package, text: str) -> Version:
    """``text`` as the package's next version; raises ValueError saying what to change."""
    try:
        version = Version(text)
    except InvalidVersion:
        raise ValueError(f"{text!r} is not a version; give one like 0.2.0.") from None
    if not _SEMVER.match(text):
        raise ValueError(f"{text!r}: releases are MAJOR.MINOR.PATCH, optionally with a pre-release (0.2.0rc1).")
    released = package.released_versions()
    if released and version <= released[-1]:
        raise ValueError(f"{package.dist} already released {released[-1]}; the next version must be higher.")
    if not released and version < package.version:
        raise ValueError(f"{package.dist} is at {package.version}; its first release cannot be lower.")
    return version


def write_version(package: Package, version: Version) -> None:
    text = package.version_file.read_text()
    package.version_file.write_text(_VERSION_LINE.sub(f'__version__ = "{version}"', text, count=1))


def date_unreleased_section(package: Package, version: Version, today: datetime.date) -> bool:
    """Date the hand-written ``## <version> — unreleased`` section (notes written before fragments existed)."""
    path = package.path / "CHANGELOG.md"
    text = path.read_text()
    heading = f"## {version} — unreleased"
    if heading not in text:
        return False
    path.write_text(text.replace(heading, f"{CHANGELOG_START}\n\n## {version} — {today.isoformat()}", 1))
    return True


# -- test records -----------------------------------------------------------------------------------------------

PASSED = ROOT / ".test-artifacts" / "passed"


def tested_key(folders: list[str]) -> str | None:
    """What a test run of packages ``folders`` covers: their committed trees, the test helpers and the pins. None
    where any of it has uncommitted changes (such a run vouches for no commit)."""
    paths = [f"packages/{folder}" for folder in folders] + ["testutils", "constraints.txt", "noxfile.py"]
    try:
        if git("status", "--porcelain", "--", *paths):
            return None
        trees = [git("rev-parse", f"HEAD:{path}") for path in paths]
    except (OSError, subprocess.CalledProcessError):
        return None
    return hashlib.sha256(" ".join(trees).encode()).hexdigest()


def record_tests_passed(package: str, key: str) -> None:
    PASSED.mkdir(parents=True, exist_ok=True)
    (PASSED / package).write_text(key + "\n")


def tests_passed(package: str) -> str | None:
    """The key of the last whole passing run of ``package``'s tests, if one was recorded here."""
    path = PASSED / package
    return path.read_text().strip() if path.is_file() else None


# -- the index --------------------------------------------------------------------------------------------------


def write_simple_index(dist: Path) -> Path:
    """A PEP 503 simple index of the sdists and wheels in ``dist``, at ``dist/simple``; returns its folder."""
    simple = dist / "simple"
    files: dict[str, list[Path]] = {}
    for path in sorted(dist.iterdir()):
        if path.name.endswith((".whl", ".tar.gz")):
            name = path.name.split("-")[0]
            files.setdefault(canonicalize_name(name), []).append(path)
    simple.mkdir(exist_ok=True)
    for name, paths in files.items():
        project = simple / name
        project.mkdir(exist_ok=True)
        links = "\n".join(
            f'<a href="../../{html.escape(p.name)}#sha256={hashlib.sha256(p.read_bytes()).hexdigest()}">'
            f"{html.escape(p.name)}</a><br>"
            for p in paths
        )
        project.joinpath("index.html").write_text(f"<!DOCTYPE html>\n<html><body>\n{links}\n</body></html>\n")
    names = "\n".join(f'<a href="{n}/">{n}</a><br>' for n in sorted(files))
    simple.joinpath("index.html").write_text(f"<!DOCTYPE html>\n<html><body>\n{names}\n</body></html>\n")
    return simple
