"""One report over every benchmark's result file: a Markdown table of ratios and a chart of them.

Reads ``benchmarks/results/<name>.json`` (written by ``benchlib.write_results``) and writes ``REPORT.md`` and
``ratios.png`` beside them. Ratios are the headline because only what ran side by side on the same noisy machine
compares; absolute seconds stay in the detail tables. The output depends only on the result files, so
regenerating it from unchanged results changes no byte.
"""

from __future__ import annotations

import argparse
import json
import math
import textwrap
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display on CI or benchmark machines

import matplotlib.pyplot as plt  # after matplotlib.use: the backend must be chosen first
from matplotlib.artist import Artist
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from benchlib import format_value

RESULTS = Path(__file__).parent / "results"
COLOURS = {"meets": "#2e7d32", "misses": "#c62828", "-": "#9e9e9e"}
# Baselines the headline sums up, matched by substring in this order: the contenders users choose between,
# then the limits (the bare Ray call or actor that elastrain itself builds on).
FAMILIES = [
    ("Ray Train", "Ray Train"),
    ("Ray Tune", "Ray Tune"),
    ("Horovod", "Horovod"),
    ("raw ", "the raw limits"),
    ("(limit)", "the raw limits"),
    ("ray.nodes()", "the raw limits"),
]
MACHINE_KEYS = ["python", "platform", "cpus", "processor", "cpu_model", "memory_gib"]

Result = dict[str, Any]


def load(folder: Path) -> list[Result]:
    results = [json.loads(path.read_text()) for path in sorted(folder.glob("*.json"))]
    return [r for r in results if isinstance(r, dict) and "rows" in r and "benchmark" in r]


def compared(row: dict[str, Any]) -> bool:
    return bool(row.get("baseline")) and (row.get("baseline_s") or 0) > 0


def ratio(row: dict[str, Any]) -> float:
    return float(row["value_s"]) / float(row["baseline_s"])  # recomputed: older files may lack "ratio"


def format_ratio(value: float) -> str:
    # Two significant digits below 0.1 (0.0014×, 0.071×) so that the largest wins do not all read 0.00×.
    decimals = 2 if value <= 0 else max(2, 1 - math.floor(math.log10(value)))
    return f"{value:.{decimals}f}×"


def target(row: dict[str, Any]) -> str:
    bounds = [] if row.get("target_ratio") is None else [f"≤ {row['target_ratio']:.3g}×"]
    bounds += [] if row.get("target_s") is None else [f"≤ {format_value(row['target_s'], row.get('unit', 's'))}"]
    return ", ".join(bounds) or "-"


def headline(results: list[Result]) -> str:
    rows = [row for result in results for row in result["rows"] if compared(row)]
    judged = [row for row in rows if row.get("verdict") in ("meets", "misses")]
    met = sum(row["verdict"] == "meets" for row in judged)
    parts = [f"{met} of {len(judged)} targets met."]
    for family in dict.fromkeys(name for _, name in FAMILIES):
        ratios = sorted(ratio(row) for row in rows if _family(row["baseline"]) == family)
        if ratios:
            span = format_ratio(ratios[0]) + ("" if len(ratios) == 1 else f" to {format_ratio(ratios[-1])}")
            parts.append(f"Against {family}: {span} ({len(ratios)} comparisons).")
    return " ".join(parts) + " Ratios are elastrain's time over the baseline's: lower is better, 1.00× is parity."


def _family(baseline: str) -> str | None:
    return next((name for pattern, name in FAMILIES if pattern in baseline), None)


def ratio_table(results: list[Result]) -> list[str]:
    lines = ["| benchmark | case | metric | ratio | target | verdict | baseline |", "|---|---|---|---|---|---|---|"]
    for result in results:
        for index, row in enumerate(r for r in result["rows"] if compared(r)):
            name = f"**{result['benchmark']}**" if index == 0 else ""  # the name once per group reads as a heading
            lines.append(
                f"| {name} | {row['case']} | {row['metric']} | **{format_ratio(ratio(row))}** | {target(row)} | "
                f"{row.get('verdict', '-')} | {row['baseline']} |"
            )
    return lines


def details(result: Result) -> list[str]:
    lines = [f"### {result['benchmark']}", "", f"Ran {result.get('when', 'at an unrecorded time')}.", ""]
    lines += ["| case | metric | elastrain | baseline | baseline time | ratio |", "|---|---|---|---|---|---|"]
    for row in result["rows"]:
        unit = row.get("unit", "s")
        baseline_s = format_value(row["baseline_s"], unit) if compared(row) else "-"
        shown = format_ratio(ratio(row)) if compared(row) else "-"
        lines.append(
            f"| {row['case']} | {row['metric']} | {format_value(row['value_s'], unit)} | "
            f"{row.get('baseline') or '-'} | {baseline_s} | {shown} |"
        )
    notes = result.get("notes") or {}
    if notes.get("curves"):
        lines += ["", f"![{result['benchmark']}: time against size, log-log]({curves_file(result)})"]
    if notes:
        lines += ["", "Notes:", ""]
        lines += [f"- `{key}`: {json.dumps(value, ensure_ascii=False)}" for key, value in notes.items()]
    return [*lines, ""]


def machines(results: list[Result]) -> list[str]:
    # Benchmarks that ran on the same machine share one description; a differing one gets its own.
    groups: dict[str, list[Result]] = {}
    for result in results:
        groups.setdefault(json.dumps(result.get("machine", {}), sort_keys=True), []).append(result)
    lines = []
    for key, members in groups.items():
        described = json.loads(key)
        fields = [f"{name} `{described[name]}`" for name in MACHINE_KEYS if name in described]
        fields += [f"{name} `{value}`" for name, value in described.items() if name not in MACHINE_KEYS]
        ran = ", ".join(f"`{r['benchmark']}` ({r.get('when', '?')})" for r in members)
        if "cpu_model" not in described:  # results written before benchlib recorded these
            fields.append("CPU model and memory not recorded")
        lines.append(f"- {'; '.join(fields)}. Ran: {ran}.")
    return lines


def markdown(results: list[Result], chart: str) -> str:
    lines = ["# elastrain benchmark report", "", headline(results), ""]
    lines += ratio_table(results)
    lines += ["", f"![ratios against each baseline, log scale]({chart})", "", "## Machine", ""]
    lines += machines(results)
    lines += ["", "## Details (absolute times)", ""]
    for result in results:
        lines += details(result)
    lines += [
        "Regenerate with `python3 -m nox -s bench` (runs every benchmark, then this report); "
        "`python3 -m nox -s bench_report` rebuilds only the report from the result files.",
    ]
    return "\n".join(lines) + "\n"


def chart(results: list[Result], output: Path) -> None:
    bars = [(result["benchmark"], row) for result in results for row in result["rows"] if compared(row)]
    bars.reverse()  # barh draws bottom-up; reversed, the chart reads in the table's order
    values = [ratio(row) for _, row in bars]
    targets = [row["target_ratio"] for _, row in bars if row.get("target_ratio") is not None]
    low = 10 ** math.floor(math.log10(min([*values, *targets, 1.0])))
    high = 10 ** math.ceil(math.log10(max([*values, *targets, 1.0]) * 3))  # room for the value labels

    fig, ax = plt.subplots(figsize=(12, 0.5 * len(bars) + 2), layout="constrained")
    ax.barh(range(len(bars)), values, color=[COLOURS.get(row.get("verdict", "-"), COLOURS["-"]) for _, row in bars])
    for y, ((name, row), value) in enumerate(zip(bars, values, strict=True)):
        bound = row.get("target_ratio")
        if bound is not None:
            ax.plot(bound, y, marker="|", markersize=14, markeredgewidth=2.5, color="black")
        # The value sits right of its bar, or right of the target marker where that would cover it.
        beside = bound if bound is not None and value <= bound < value * 5 else value
        ax.text(beside * 1.15, y, format_ratio(value), va="center", fontsize=8)
        if y == len(bars) - 1 or bars[y + 1][0] != name:  # topmost bar of a benchmark: name the group
            ax.text(0.995, y, name, transform=ax.get_yaxis_transform(), ha="right", va="center", weight="bold")
            ax.axhline(y + 0.5, color="grey", linewidth=0.6)
    ax.axvline(1.0, color="black", linestyle="--", linewidth=1)
    ax.set_xscale("log")
    ax.set_xlim(low, high)
    ax.set_yticks(range(len(bars)), [_label(row) for _, row in bars], fontsize=8)
    ax.set_ylim(-0.6, len(bars) - 0.5)
    ax.set_xlabel("elastrain time / baseline time (log scale; lower is better)")
    ax.set_title("elastrain against its baselines")
    ax.grid(axis="x", which="major", alpha=0.3)
    legend: list[Artist] = [
        Patch(color=COLOURS["meets"], label="meets target"),
        Patch(color=COLOURS["misses"], label="misses"),
        Patch(color=COLOURS["-"], label="reported only (no target)"),
        Line2D([], [], color="black", marker="|", linestyle="", markersize=12, label="target"),
        Line2D([], [], color="black", linestyle="--", label="parity (1.0×)"),
    ]
    fig.legend(handles=legend, loc="outside lower center", ncol=len(legend), fontsize=8, frameon=False)
    # No "Software" entry: the PNG's bytes then depend only on the results (and matplotlib's version).
    fig.savefig(output, dpi=150, metadata={"Software": None})
    plt.close(fig)


def curves_file(result: Result) -> str:
    return f"{result['benchmark']}-curves.png"


def curves_chart(result: Result, output: Path) -> None:
    """Each curve of ``notes["curves"]`` ({name: {size: seconds}}) against size, log-log, with O(N) and O(N²)
    guides through the first curve's first point: a curve steeper than the O(N) guide grows faster than the job."""
    curves: dict[str, dict[str, float]] = result["notes"]["curves"]
    fig, ax = plt.subplots(figsize=(10, 6.5), layout="constrained")
    markers = "osD^v<>ph*"
    for index, (name, points) in enumerate(curves.items()):
        sizes = sorted(int(n) for n in points)
        ax.plot(sizes, [points[str(n)] for n in sizes], marker=markers[index % len(markers)], label=name)
    first = next(iter(curves.values()))
    sizes = sorted(int(n) for n in first)
    if len(sizes) > 1:
        n0, t0 = sizes[0], first[str(sizes[0])]
        for power, style, label in ((1, ":", "O(N) guide"), (2, "--", "O(N²) guide")):
            ax.plot(sizes, [t0 * (n / n0) ** power for n in sizes], color="grey", linestyle=style, label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("workers (N)")
    ax.set_ylabel("seconds (log scale)")
    ax.set_title(f"{result['benchmark']}: time against N")
    ax.grid(which="major", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    fig.savefig(output, dpi=120, metadata={"Software": None})
    plt.close(fig)


def _label(row: dict[str, Any]) -> str:
    return textwrap.fill(f"{row['case']}: {row['metric']}", width=60) + f"\nvs {row['baseline']}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=RESULTS, help="folder of <name>.json result files")
    args = parser.parse_args()
    results = load(args.results)
    if not results:
        raise SystemExit(f"No benchmark results in {args.results}; run `python3 -m nox -s bench` first.")
    chart(results, args.results / "ratios.png")
    for result in results:
        if (result.get("notes") or {}).get("curves"):
            curves_chart(result, args.results / curves_file(result))
    (args.results / "REPORT.md").write_text(markdown(results, "ratios.png"))
    print(f"wrote {args.results / 'REPORT.md'} and {args.results / 'ratios.png'}", flush=True)


if __name__ == "__main__":
    main()
