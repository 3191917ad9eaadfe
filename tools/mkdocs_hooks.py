"""mkdocs hooks (mkdocs.yml `hooks:`) for what the docs site takes from outside docs/.

- The benchmark report: `benchmarks/results/REPORT.md` is written by `nox -s bench_report`, not by hand, so
  docs/benchmarks.md holds a marker that is replaced by the report (its title dropped: the page has its own),
  and the files the report refers to (the chart) are added to the site. A missing report fails the build.
- Development notes: every docs/notes/*.md, in name order, goes into the nav under "Development notes", so a
  new session's notes need no edit of mkdocs.yml (strict mode fails on a page that is in no nav).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
REPORT = RESULTS / "REPORT.md"
REPORT_PAGE = "benchmarks.md"
MARKER = "<!-- benchmarks/results/REPORT.md -->"
# Where the report's own files (its chart) land in the site, relative to the docs root.
REPORT_FILES = "benchmark-report"
NOTES_SECTION = "Development notes"
# Relative links and images in the report: ](target) with no scheme, no anchor-only target.
_LINK = re.compile(r"\]\((?!#)(?![a-z][a-z0-9+.-]*:)([^)\s#]+)([^)]*)\)", re.IGNORECASE)

_report_files: set[str] = set()


def on_config(config: Any) -> Any:
    notes = sorted((Path(config.docs_dir) / "notes").glob("*.md"))
    if notes and config.nav is not None:
        config.nav = [entry for entry in config.nav if not (isinstance(entry, dict) and NOTES_SECTION in entry)]
        config.nav.append({NOTES_SECTION: [f"notes/{note.name}" for note in notes]})
    return config


def on_files(files: Files, config: Any) -> Files:
    report = _read_report()
    _report_files.clear()
    for target, _ in _LINK.findall(report):
        source = (RESULTS / target).resolve()
        if source.is_file() and source.parent == RESULTS.resolve() and target not in _report_files:
            files.append(File.generated(config, f"{REPORT_FILES}/{source.name}", abs_src_path=str(source)))
            _report_files.add(target)
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    if page.file.src_uri != REPORT_PAGE:
        return markdown
    if MARKER not in markdown:
        raise PluginError(f"docs/{REPORT_PAGE} lost the line {MARKER} that the benchmark report replaces.")
    lines = _read_report().splitlines()
    if lines and lines[0].startswith("# "):
        lines = lines[1:]  # the report's title: the page has its own

    def relink(match: re.Match[str]) -> str:
        target = match.group(1)
        if target in _report_files:
            return f"]({REPORT_FILES}/{Path(target).name}{match.group(2)})"
        return match.group(0)  # left as written: strict mode reports it if it leads nowhere

    return markdown.replace(MARKER, _LINK.sub(relink, "\n".join(lines).strip() + "\n"))


def _read_report() -> str:
    if not REPORT.is_file():
        raise PluginError(
            f"The benchmark report {REPORT} is missing: run the benchmarks "
            "(python3 -m nox -s bench) or, from existing results, python3 -m nox -s bench_report."
        )
    return REPORT.read_text(encoding="utf-8")
