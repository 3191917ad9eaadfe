"""Prometheus metrics of the API: runs by status, and request latencies by route and status code."""

from __future__ import annotations

import threading

# Latency buckets in seconds (Prometheus' defaults, from 1 ms).
_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class ApiMetrics:
    """A small, dependency-free exposition of the text format (version 0.0.4)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, int], list[int]] = {}  # bucket counts, then +Inf
        self._sums: dict[tuple[str, int], float] = {}

    def observe(self, route: str, status: int, seconds: float) -> None:
        key = (route, status)
        with self._lock:
            counts = self._counts.setdefault(key, [0] * (len(_BUCKETS) + 1))
            for index, bound in enumerate(_BUCKETS):
                if seconds <= bound:
                    counts[index] += 1
            counts[-1] += 1
            self._sums[key] = self._sums.get(key, 0.0) + seconds

    def render(self, runs_by_status: dict[str, int] | None) -> str:
        lines = [
            "# HELP elastrain_runs Training runs the state actor holds, by status.",
            "# TYPE elastrain_runs gauge",
        ]
        for status, count in sorted((runs_by_status or {}).items()):
            lines.append(f'elastrain_runs{{status="{status}"}} {count}')
        lines += [
            "# HELP elastrain_tracking_up Whether the state actor answered (1) or not (0).",
            "# TYPE elastrain_tracking_up gauge",
            f"elastrain_tracking_up {0 if runs_by_status is None else 1}",
            "# HELP elastrain_http_request_duration_seconds Time to answer an HTTP request.",
            "# TYPE elastrain_http_request_duration_seconds histogram",
        ]
        with self._lock:
            for (route, code), counts in sorted(self._counts.items()):
                labels = f'route="{_escape(route)}",code="{code}"'
                for bound, count in zip(_BUCKETS, counts, strict=False):
                    lines.append(f'elastrain_http_request_duration_seconds_bucket{{{labels},le="{bound}"}} {count}')
                lines.append(f'elastrain_http_request_duration_seconds_bucket{{{labels},le="+Inf"}} {counts[-1]}')
                lines.append(f"elastrain_http_request_duration_seconds_sum{{{labels}}} {self._sums[(route, code)]}")
                lines.append(f"elastrain_http_request_duration_seconds_count{{{labels}}} {counts[-1]}")
        return "\n".join(lines) + "\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
