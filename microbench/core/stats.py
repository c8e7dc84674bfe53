"""Statistics over iteration times, kept as plain data."""

from __future__ import annotations

import math
from typing import Iterable, Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default), q in [0, 100]."""
    if not values:
        return math.nan
    ordered = sorted(values)
    if len(ordered) == 1:
        return float(ordered[0])
    pos = (len(ordered) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return float(ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo))


def summarize_us(times_s: Iterable[float]) -> dict[str, float]:
    """p50/p95/p99/max/mean/min in microseconds from times in seconds."""
    values = [t * 1e6 for t in times_s]
    if not values:
        return {
            "p50": math.nan,
            "p95": math.nan,
            "p99": math.nan,
            "max": math.nan,
            "min": math.nan,
            "mean": math.nan,
            "n": 0,
        }
    return {
        "p50": percentile(values, 50),
        "p95": percentile(values, 95),
        "p99": percentile(values, 99),
        "max": max(values),
        "min": min(values),
        "mean": sum(values) / len(values),
        "n": len(values),
    }
