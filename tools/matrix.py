"""The integration matrix: which versions each cell installs, and the report of the last full run.

Three axes (docs/compatibility.md):
- **ray**: every package that requires Ray, at the declared floor, one minor in between and the pinned latest;
- **floors**: each package's tests with every direct third-party dependency at its declared floor (what
  ``--resolution=lowest-direct`` picks: direct dependencies lowest, everything else newest);
- **upgrade**: each package from this checkout against its siblings' previous release, built from the release
  commits, which proves a user can upgrade that package alone.

torch has one version: its declared floor is the pinned version (the only CPU build this project can install
without several GB of CUDA wheels), so every cell that installs torch tests both. `noxfile.py` runs the cells;
this module only decides what they hold. Standard library, git and `packaging` only.
"""

from __future__ import annotations

import datetime
import json
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import releasing
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = releasing.ROOT
CONSTRAINTS = ROOT / "constraints.txt"
REPORT = ROOT / "docs" / "compatibility.md"
TABLE_START = "<!-- matrix table start -->"
TABLE_END = "<!-- matrix table end -->"

# The executor's tests that reach Ray (every Ray API the package calls: actors, placement groups, node table,
# scheduling strategies, runtime context, the raylet watch, Cluster nodes); the rest are pure-Python model tests,
# torch numerics and doc checks that a Ray version cannot change. Five kills in a row make the same Ray calls as
# the one kill of the tests around it, five times over (50 s). Keeps a Ray cell of the executor near 5 min: CI runs
# the floor's every other day.
RAY_FACING_TESTS = {
    "executor": (
        "tests/test_static_jobs.py",
        "tests/test_cluster.py",
        "tests/test_elastic.py",
        "tests/test_elastic_cluster.py",
        "tests/test_elastic_placement_group.py",
        "tests/test_raylet_watch.py",
        "tests/test_version_skew.py",
        "tests/test_messages.py",
        "--deselect",
        "tests/test_elastic_cluster.py::test_five_worker_kills_in_a_row_lose_nothing",
    ),
}
# Ray before 2.60 leaks its log files' handles when it starts a node (ResourceWarning, raised as an unraisable-
# exception warning at the next test). The cells with an older Ray let those pass; the pinned cells still fail on
# any unraisable exception, ours included. Ray 2.41-2.59 also warn at every `ray.init` of a default they will
# change for GPU jobs (FutureWarning); it is Ray's notice to users, not a fault of ours.
OLD_RAY_PYTEST_ARGS = (
    "-W",
    "ignore::pytest.PytestUnraisableExceptionWarning",
    "-W",
    "ignore::FutureWarning:ray._private.worker",
)

# s3fs and gcsfs 2024.6 leave aiohttp client sessions unclosed when the interpreter exits (ResourceWarning, raised
# as unraisable-exception warnings at pytest's exit after every test passed); their newer releases close them. The
# durable floors cell lets those pass; `tests(durable)`, at the pins, still fails on any.
FLOORS_PYTEST_ARGS = {"durable": ("-W", "ignore::pytest.PytestUnraisableExceptionWarning")}


@dataclass(frozen=True)
class Cell:
    axis: str  # "ray", "floors" or "upgrade"
    package: str  # folder under packages/ whose tests run
    pins: dict[str, str] = field(default_factory=dict)  # distribution -> exact version
    keep_pins: bool = True  # False: only ``pins`` and the test tools are pinned, the rest resolves newest
    old_siblings: tuple[str, ...] = ()  # sibling folders installed from their previous release
    pytest_args: tuple[str, ...] = ()

    @property
    def id(self) -> str:
        if self.axis == "ray":
            return f"ray-{self.pins['ray']}-{self.package}"
        return f"{self.axis}-{self.package}"

    @property
    def all_pytest_args(self) -> tuple[str, ...]:
        ray = self.pins.get("ray")
        old_ray = ray is not None and Version(ray) < Version(pinned_versions()["ray"])
        return (*self.pytest_args, *(OLD_RAY_PYTEST_ARGS if old_ray else ()))

    @property
    def pinned_latest(self) -> bool:
        """What `tests(<package>)` runs anyway: CI need not run it twice."""
        return self.axis == "ray" and self.pins["ray"] == pinned_versions()["ray"]


def pinned_versions() -> dict[str, str]:
    """constraints.txt as {canonical name: version}."""
    pins = {}
    for line in CONSTRAINTS.read_text().splitlines():
        line = line.split("#")[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            pins[canonicalize_name(name.split("[")[0])] = version.strip()
    return pins


def floor(requirement: Requirement) -> str | None:
    """The lowest version ``requirement`` admits, as an exact version (``>=2.40`` -> ``2.40.0``)."""
    for spec in requirement.specifier:
        if spec.operator in (">=", "==", "~="):
            release = Version(spec.version).release
            return ".".join(str(part) for part in (*release, 0, 0)[: max(3, len(release))])
    return None


def direct_third_party(package: releasing.Package, extras: tuple[str, ...]) -> dict[str, Requirement]:
    """The package's own requirements and those of ``extras`` that are not elastrain siblings."""
    siblings = releasing.by_dist()
    project = tomllib.loads((package.path / "pyproject.toml").read_text())["project"]
    listed = list(project.get("dependencies", []))
    for extra in extras:
        listed += project.get("optional-dependencies", {}).get(extra, [])
    found = {}
    for text in listed:
        requirement = Requirement(text)
        if canonicalize_name(requirement.name) not in siblings:
            found[canonicalize_name(requirement.name)] = requirement
    return found


def ray_versions() -> tuple[str, str, str]:
    """The declared floor, the minor half way to the pin, and the pin."""
    floors = set()
    for package in releasing.packages():
        requirement = direct_third_party(package, ()).get("ray")
        if requirement is not None:
            floors.add(Version(floor(requirement) or "0"))
    lowest, pinned = min(floors), Version(pinned_versions()["ray"])
    middle = f"{lowest.major}.{(lowest.minor + pinned.minor) // 2}.0"
    return str(lowest), middle, str(pinned)


def sibling_folders(package: str, test_siblings: dict[str, tuple[str, ...]]) -> list[str]:
    """Every sibling ``package``'s tests install (its dependencies and its test siblings'), transitively."""
    by_dist = releasing.by_dist()
    found: list[str] = []

    def visit(folder: str) -> None:
        for requirement in releasing.Package(folder, "").requirements():
            sibling = by_dist.get(canonicalize_name(requirement.name))
            if sibling is not None and sibling.folder not in found and sibling.folder != package:
                found.append(sibling.folder)
                visit(sibling.folder)

    visit(package)
    for extra in test_siblings.get(package, ()):
        if extra not in found:
            found.append(extra)
            visit(extra)
    return sorted(found)


def cells(test_extras: dict[str, tuple[str, ...]], test_siblings: dict[str, tuple[str, ...]]) -> list[Cell]:
    """Every cell of the matrix. ``test_extras`` and ``test_siblings``: what each package's tests install."""
    found = []
    pins = pinned_versions()
    for version in ray_versions():
        for package in releasing.packages():
            ray = direct_third_party(package, ()).get("ray")
            if ray is not None and ray.specifier.contains(version):  # a Ray below its own floor is no cell
                args = () if version == pins["ray"] else RAY_FACING_TESTS.get(package.folder, ())
                found.append(Cell("ray", package.folder, {"ray": version}, pytest_args=args))
    for package in releasing.packages():
        wanted = direct_third_party(package, test_extras.get(package.folder, ()))
        floors = {name: v for name, r in wanted.items() if (v := floor(r)) is not None}
        args = FLOORS_PYTEST_ARGS.get(package.folder, ())
        found.append(Cell("floors", package.folder, floors, keep_pins=False, pytest_args=args))
    for package in releasing.packages():
        old = tuple(sibling_folders(package.folder, test_siblings))
        if old:
            found.append(Cell("upgrade", package.folder, old_siblings=old))
    return found


# The longest a cell may take (its last time in the table) to be in CI's rotation on the days between the executor's
# Ray floor. A whole-suite executor cell (floors, upgrade: ~15 min) or a tune cell would put CI over its 50 minutes
# on the day it came round; those run in `nox -s matrix` only.
CI_CELL_MAX_S = 200


def ci_turn(seed: int) -> int:
    """The turn of a CI run in its rotations: the day its seed names (YYYYMMDD) as a day number, so consecutive
    days take consecutive turns; a seed that is not a day is its own turn."""
    try:
        return datetime.datetime.strptime(str(seed), "%Y%m%d").toordinal()
    except ValueError:
        return seed


def ci_cells(all_cells: list[Cell], seed: int) -> list[Cell]:
    """The one cell a CI run adds to the pinned latest (which `tests(<package>)` runs anyway), in turn by day: every
    other day the executor at Ray's floor (its Ray use is the widest, and a floor is where Ray breaks code), and on
    the days between, the next of the other cells that passed in the last report within CI_CELL_MAX_S. CI guards
    what works; the report lists what does not yet. (A fresh table with no passing cell gives the executor's floor
    every day.)"""
    passing = {cell for cell, seconds in last_passed().items() if seconds <= CI_CELL_MAX_S}
    candidates = [cell for cell in all_cells if not cell.pinned_latest]
    ray_floor = ray_versions()[0]
    executor_floor = [
        c for c in candidates if c.axis == "ray" and c.package == "executor" and c.pins["ray"] == ray_floor
    ]
    rest = [c for c in candidates if c not in executor_floor and c.id in passing]
    turn = ci_turn(seed)
    if turn % 2 == 0 or not rest:
        return executor_floor
    return [rest[(turn // 2) % len(rest)]]


def constraints_for(cell: Cell, keep: tuple[str, ...]) -> str:
    """The constraints file of ``cell``: constraints.txt with its pins replaced, or only its pins and the
    ``keep`` names (test tools, torch) where the rest must resolve newest."""
    pins = pinned_versions()
    wanted = {canonicalize_name(name): version for name, version in cell.pins.items()}
    lines = [f"# matrix cell {cell.id} (tools/matrix.py)"]
    for name, version in sorted(pins.items()):
        if name in wanted:
            continue
        if cell.keep_pins or name in {canonicalize_name(k) for k in keep}:
            lines.append(f"{name}=={version}")
    lines += [f"{name}=={version}" for name, version in sorted(wanted.items())]
    return "\n".join(lines) + "\n"


def release_commit(folder: str) -> str | None:
    """The commit of ``folder``'s newest release: its tag where the checkout has tags, else the release commit
    (`nox -s release` commits "release: <dist> <version>"), so a clone without tags still finds it."""
    package = next(p for p in releasing.packages() if p.folder == folder)
    released = package.released_versions()
    if not released:
        return None
    tag = f"{folder}-v{released[-1]}"
    try:
        return releasing.git("rev-list", "-n", "1", tag)
    except releasing.subprocess.CalledProcessError:
        found = releasing.git("log", "-1", "--format=%H", f"--grep=^release: {package.dist} {released[-1]}$")
        return found or None


# -- the report -------------------------------------------------------------------------------------------------


def record_result(results: Path, cell: Cell, outcome: str, versions: dict[str, str], seconds: float) -> None:
    """One line per cell run in ``results``/matrix.jsonl: what `nox -s matrix_report` tabulates."""
    results.mkdir(exist_ok=True)
    row = {"cell": cell.id, "axis": cell.axis, "package": cell.package, "outcome": outcome, "seconds": round(seconds)}
    row |= {"versions": versions, "date": datetime.date.today().isoformat()}
    with open(results / "matrix.jsonl", "a") as out:
        out.write(json.dumps(row) + "\n")


def last_passed() -> dict[str, int]:
    """The cells docs/compatibility.md's table says passed, with the seconds each took."""
    found = re.findall(r"^\| `([^`]+)` \|.*\| passed \([^)]*\) \| (\d+) s \|$", REPORT.read_text(), re.MULTILINE)
    return {cell: int(seconds) for cell, seconds in found}


def write_report(results: Path, current: set[str] | None = None) -> str:
    """Update docs/compatibility.md's table with the newest result of every cell in ``results``; a cell that did
    not run this time keeps its row (with its date), so a partial run or a fresh clone never drops a result. Rows of
    cells no longer in ``current`` (the matrix's cell ids; a floor went up) go."""
    text = REPORT.read_text()
    pattern = re.compile(re.escape(TABLE_START) + "(.*?)" + re.escape(TABLE_END), re.DOTALL)
    found = pattern.search(text)
    kept = re.findall(r"^(\| `([^`]+)` \|.*)$", found.group(1) if found else "", re.MULTILINE)
    rows = {cell: line for line, cell in kept}
    for line in (results / "matrix.jsonl").read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            rows[str(row["cell"])] = _table_row(row)
    if current is not None:
        rows = {cell: line for cell, line in rows.items() if cell in current}
    header = "| cell | package | Ray | torch | floors and old siblings | result | time |\n|---|---|---|---|---|---|---|"
    table = "\n".join([header, *(rows[cell] for cell in sorted(rows, key=_row_order))])
    REPORT.write_text(pattern.sub(lambda _: f"{TABLE_START}\n{table}\n{TABLE_END}", text, count=1))
    return table


def _table_row(row: dict[str, object]) -> str:
    versions: dict[str, str] = row["versions"]  # type: ignore[assignment]
    others = ", ".join(f"{k} {v}" for k, v in sorted(versions.items()) if k not in ("ray", "torch"))
    return (
        f"| `{row['cell']}` | {row['package']} | {versions.get('ray', '—')} | {versions.get('torch', '—')} | "
        f"{others or '—'} | {row['outcome']} ({row['date']}) | {row['seconds']} s |"
    )


def _row_order(cell: str) -> tuple[str, str]:
    """Axis first, then the package (a cell id is ``<axis>-...-<package>``, the Ray version in between)."""
    axis = cell.split("-", 1)[0]
    package = next((p.folder for p in releasing.packages() if cell.endswith(f"-{p.folder}")), cell)
    return axis, package + " " + cell
