"""Repository layout rules that no linter knows; run by `nox -s lint`."""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

import releasing  # tools/, beside this script

ROOT = Path(__file__).resolve().parent.parent
REQUIRED_PINS = ("torch==2.13.0", "ray==2.60.0")


def readme_commands() -> list[str]:
    """The shell commands in the README's first code block: the main job, then all tests."""
    text = (ROOT / "README.md").read_text()
    match = re.search(r"```(?:bash|sh)\n(.*?)```", text, re.DOTALL)
    if not match:
        return []
    return [line for line in match.group(1).splitlines() if line.strip() and not line.lstrip().startswith("#")]


def problems() -> list[str]:
    found = []
    commands = readme_commands()
    if len(commands) != 2:
        found.append(f"README.md's first code block must hold exactly two commands (demo, tests), has {commands}.")
    else:
        ci_lines = [line for line in (ROOT / ".ci/run").read_text().splitlines() if line and line[0] not in "#"]
        if ci_lines[-1] != commands[1]:
            found.append(f".ci/run runs {ci_lines[-1]!r}, but the README's test command is {commands[1]!r}.")

    pins = (ROOT / "constraints.txt").read_text().split()
    found += [f"constraints.txt must pin {pin}." for pin in REQUIRED_PINS if pin not in pins]

    for folder in sorted(p for p in (ROOT / "packages").iterdir() if p.is_dir()):
        pyproject = tomllib.loads((folder / "pyproject.toml").read_text())
        module = folder.name.replace("-", "_")
        package_dir = folder / "src" / "elastrain" / module
        if (folder / "src" / "elastrain" / "__init__.py").exists():
            found.append(f"{folder.name} ships src/elastrain/__init__.py, which masks the shared namespace.")
        for required in ("README.md", "CHANGELOG.md", "tests"):
            if not (folder / required).exists():
                found.append(f"packages/{folder.name} has no {required}.")
        for required in ("__init__.py", "_version.py", "py.typed"):
            if not (package_dir / required).is_file():
                found.append(f"packages/{folder.name} has no src/elastrain/{module}/{required}.")
        if pyproject["build-system"]["build-backend"] != "hatchling.build":
            found.append(f"packages/{folder.name} must build with hatchling.")
        if pyproject["project"]["name"] != f"elastrain-{folder.name}":
            found.append(f"packages/{folder.name} must be named elastrain-{folder.name}.")
        if "__all__" not in (package_dir / "__init__.py").read_text():
            found.append(f"elastrain.{module} must declare its public API in __all__.")
    return found + releasing.bound_problems() + releasing.fragment_problems()


def main() -> int:
    found = problems()
    for problem in found:
        print(f"check_repo: {problem}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
