"""Run inside a clean venv by `nox -s build`: the wheels installed there import and keep the namespace open.

Usage: python check_installed.py MODULE [MODULE ...] [--absent DIST [DIST ...]]
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("modules", nargs="+")
    parser.add_argument("--absent", nargs="*", default=[], help="modules that must not be installed")
    args = parser.parse_args()
    import elastrain

    if getattr(elastrain, "__file__", None) is not None:
        print(f"elastrain is a regular package at {elastrain.__file__}, not a namespace", file=sys.stderr)
        return 1
    for module in args.modules:
        importlib.import_module(module)
    present = [name for name in args.absent if importlib.util.find_spec(name) is not None]
    if present:
        print(f"installing {args.modules} also installed {present}", file=sys.stderr)
        return 1
    print(f"ok: imported {', '.join(args.modules)}; absent: {', '.join(args.absent) or '-'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
