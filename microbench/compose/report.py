"""Numbers as people read them, and the what-if comparisons: pure, so the printer stays thin."""

from __future__ import annotations

import math
from typing import Any, Sequence


def format_time(seconds: float | None) -> str:
    """Seconds in the unit that reads best; never scientific notation (a table of 2.52605e+06 ms
    answers nothing)."""
    if seconds is None:
        return "-"
    if not math.isfinite(seconds):
        return "never" if seconds > 0 else "-"
    s = abs(seconds)
    if s < 1e-3:
        return f"{seconds * 1e6:.0f} us"
    if s < 1:
        return f"{seconds * 1e3:.1f} ms"
    if s < 120:
        return f"{seconds:.2f} s"
    if s < 2 * 3600:
        return f"{seconds / 60:.1f} min"
    if s < 72 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:,.1f} days"


def format_rate(gbps: float | None) -> str:
    if gbps is None:
        return "-"
    if not math.isfinite(gbps):
        return "never (latency alone exceeds compute)" if gbps > 0 else "-"
    return f"{gbps:,.2f} GB/s" if gbps < 100 else f"{gbps:,.0f} GB/s"


def format_bytes(n: float) -> str:
    return f"{n / 1e9:,.1f} GB" if n >= 1e8 else f"{n / 1e6:,.1f} MB"


def with_ratios(rows: Sequence[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    """Each row with `ratio`: its `key` over the best (smallest) row's, so 1.00 is the best buy."""
    best = min((r[key] for r in rows if r[key] is not None and r[key] > 0), default=None)
    return [dict(r, ratio=(r[key] / best if best and r[key] is not None else None)) for r in rows]
