"""``python -m elastrain_testutils.guard REPO_ROOT``: fail when an elastrain distribution came from an index."""

from __future__ import annotations

import sys
from pathlib import Path

from elastrain_testutils.packaging import check_installed_from_checkout


def main(argv: list[str]) -> int:
    root = Path(argv[0]) if argv else Path.cwd()
    problems = check_installed_from_checkout(root)
    for problem in problems:
        print(f"guard: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
