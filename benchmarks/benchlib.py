"""What every benchmark shares: interleaved timing, ratio rows against a baseline, and the result file.

Benchmarks report ratios against a baseline measured in the same run, never absolute targets: the machine is
noisy, so only what ran side by side compares.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


@dataclass
class Row:
    case: str
    metric: str
    value_s: float
    baseline: str
    baseline_s: float
    target_ratio: float | None  # the ratio value/baseline must stay at or below this; None: reported only
    target_s: float | None = None  # an absolute bound the issue sets, where a ratio cannot express it
    unit: str = "s"  # what value_s, baseline_s and target_s count: "s", "B" (bytes), "cores" (CPU s per s), "/s"

    @property
    def ratio(self) -> float:
        return self.value_s / self.baseline_s

    @property
    def verdict(self) -> str:
        checks = []
        if self.target_ratio is not None:
            checks.append(self.ratio <= self.target_ratio)
        if self.target_s is not None:
            checks.append(self.value_s <= self.target_s)
        if not checks:
            return "-"
        return "meets" if all(checks) else "misses"


def median_seconds(fn: Callable[[], object], repeats: int) -> float:
    """Median wall time of ``repeats`` calls of ``fn`` (for slow, whole-lifecycle measurements)."""
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def median_per_call(fn: Callable[[], object], calls: int) -> float:
    """Median time of one call over ``calls`` calls, after one warm-up call."""
    fn()
    return median_seconds(fn, calls)


def per_call_seconds(fn: Callable[[], object], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def interleaved_medians(candidates: dict[str, Callable[[], object]], *, rounds: int, calls: int) -> dict[str, float]:
    """Median per-call time of each candidate, alternating between them every round so drift hits all alike."""
    samples: dict[str, list[float]] = {name: [] for name in candidates}
    for fn in candidates.values():
        per_call_seconds(fn, calls)  # warm up
    for _ in range(rounds):
        for name, fn in candidates.items():
            samples[name].append(per_call_seconds(fn, calls))
    return {name: statistics.median(values) for name, values in samples.items()}


def median_of_runs(runs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """One record from several runs of a scenario: the median of each numeric value (each run's values under
    ``samples``), a value every run agrees on as is, and each run's value where they differ. None without runs."""
    if not runs:
        return None
    keys = list(dict.fromkeys(key for run in runs for key in run))
    numeric = [key for key in keys if all(_numeric(run.get(key)) for run in runs)]
    merged: dict[str, Any] = {}
    for key in keys:
        if key not in numeric:
            values = [run.get(key) for run in runs]
            merged[key] = values[0] if all(value == values[0] for value in values) else values
    merged.update({key: statistics.median(run[key] for run in runs) for key in numeric})
    merged["samples"] = {key: [round(run[key], 3) for run in runs] for key in numeric}
    return merged


def _numeric(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def machine() -> dict[str, object]:
    described: dict[str, object] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "processor": platform.processor() or platform.machine(),
    }
    # platform.processor() is often just "x86_64" on Linux; the CPU model and memory say what the ratios ran on.
    model = _proc_field("/proc/cpuinfo", "model name")
    if model:
        described["cpu_model"] = model
    mem_kib = _proc_field("/proc/meminfo", "MemTotal")  # e.g. "24683568 kB"
    if mem_kib and mem_kib.split()[0].isdigit():
        described["memory_gib"] = round(int(mem_kib.split()[0]) / 2**20, 1)
    return described


def _proc_field(path: str, key: str) -> str | None:
    """The first ``key: value`` in a /proc file, or None where there is no such file (not Linux) or field."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        name, _, value = line.partition(":")
        if name.strip() == key:
            return value.strip()
    return None


def format_value(value: float, unit: str = "s") -> str:
    """A row's value in its unit: seconds as ``format_seconds``, bytes in KiB/MiB, rates and cores plainly."""
    if unit == "B":
        return f"{value / 2**20:.1f} MiB" if value >= 2**20 else f"{value / 2**10:.1f} KiB"
    if unit == "cores":
        return f"{value:.2f} cores"
    if unit == "/s":
        return f"{value:,.0f}/s"
    return format_seconds(value)


def format_seconds(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def markdown_table(rows: list[Row]) -> str:
    lines = [
        "| case | metric | elastrain | baseline | baseline time | ratio | target | verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        targets = [] if row.target_ratio is None else [f"≤ {row.target_ratio:g}×"]
        targets += [] if row.target_s is None else [f"≤ {format_value(row.target_s, row.unit)}"]
        target = ", ".join(targets) or "-"
        lines.append(
            f"| {row.case} | {row.metric} | {format_value(row.value_s, row.unit)} | {row.baseline} | "
            f"{format_value(row.baseline_s, row.unit)} | {row.ratio:.2f}× | {target} | {row.verdict} |"
        )
    return "\n".join(lines)


def write_results(name: str, rows: list[Row], output: Path, notes: dict[str, object] | None = None) -> None:
    output.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "benchmark": name,
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine(),
        "rows": [{**asdict(row), "ratio": row.ratio, "verdict": row.verdict} for row in rows],
        "notes": notes or {},
    }
    output.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"\n## {name}\n\n{markdown_table(rows)}\n\nwritten to {output}", flush=True)


def parse_args(description: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--output", type=Path, required=True, help="where to write the JSON results")
    parser.add_argument("--quick", action="store_true", help="fewer rounds, for a smoke run")
    return parser.parse_args()
