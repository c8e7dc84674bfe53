"""Latency-bandwidth model fitted to a measured curve: t(S) = latency + S*factor / peak_busbw.

Fitted by least squares on relative error (weights 1/t^2), so small and large sizes count
alike. From it: peak bus bandwidth, latency, and the size that reaches half the peak, where
S*factor = latency * peak. Sizes at least four times that reach >= 80% of the peak: those are
the bandwidth-bound sizes whose measured busbw is averaged.

A fit can be degenerate: a curve that does not rise like latency + size/bandwidth (noise, a
latency-bound sweep, a link reshaped mid-run) gives a latency of 0 or below (clamped to 0), a
half-peak size of 0 B, and a "peak" below what was measured, none of which a real link has.
Such a fit says `fitted: False` and `not_fitted` (why); its model numbers stay in the dict (the
composer extrapolates with them and says so) but the printers show the reason, not the model.
"""

from __future__ import annotations

import math
from typing import Any

from .units import format_number


def fit_latency_bandwidth(rows: list[dict[str, Any]]) -> dict[str, Any]:
    placements = {r.get("placement", "out") for r in rows}
    if not placements:
        return {"placement": None, "points": 0}
    placement = "out" if "out" in placements else sorted(placements)[0]
    use = [r for r in rows if r.get("placement", "out") == placement and r["time_us"]["p50"] > 0]
    points = []
    for r in use:
        t = r["time_us"]["p50"] * 1e-6
        factor = r["busbw_gbps"] / r["algbw_gbps"] if r.get("algbw_gbps") else 1.0
        points.append((r["size_bytes"] * factor, t, r["size_bytes"], r["busbw_gbps"], factor))
    if not points:
        return {"placement": placement, "points": 0}
    if all(p[4] == 0 for p in points) or max(p[3] for p in points) <= 0:
        # A world of one rank: nothing crosses a bus, busbw is 0 by the nccl-tests convention,
        # and a bus-bandwidth model has nothing to fit (algbw stays in the rows).
        return {"placement": placement, "points": 0,
                "reason": "one rank moves no bytes between ranks: busbw is 0 (nccl-tests convention)"}
    latency_s, inv_bw = _weighted_line([p[0] for p in points], [p[1] for p in points])
    largest = max(points, key=lambda p: p[0])
    # A flat or falling curve (or one whose size term is noise next to its latency) is
    # latency-bound everywhere we measured: the best measured busbw is all we know of the peak.
    latency_bound = inv_bw <= 0 or inv_bw * largest[0] < 0.01 * largest[1]
    if latency_bound:
        peak = max(p[3] for p in points)
        inv_bw = 1 / (peak * 1e9)
        latency_s = max(0.0, min(p[1] - p[0] * inv_bw for p in points))
    latency_s = max(latency_s, 0.0)
    peak_gbps = 1 / inv_bw / 1e9
    factor = points[0][4] or 1.0
    half_size = latency_s * peak_gbps * 1e9 / factor
    bound = [p for p in points if p[2] >= 4 * half_size]
    basis = "sizes >= 4x the half-peak size"
    if not bound:
        bound, basis = [max(points, key=lambda p: p[2])], "largest size only (no size was bandwidth-bound)"
    measured_max = max(points, key=lambda p: p[3])
    why = _degenerate(len(points), latency_s, peak_gbps, measured_max[3], measured_max[2], latency_bound)
    return {
        "placement": placement,
        "points": len(points),
        "fitted": why is None,
        **({"not_fitted": why} if why else {}),
        "measured_max_busbw_gbps": measured_max[3],
        "measured_max_size_bytes": measured_max[2],
        "latency_us": latency_s * 1e6,
        "peak_busbw_gbps": peak_gbps,
        "half_peak_size_bytes": int(half_size),
        "avg_busbw_bw_bound_gbps": sum(p[3] for p in bound) / len(bound),
        "bw_bound_sizes": len(bound),
        "bw_bound_basis": basis,
        "peak_is_lower_bound": latency_bound,
    }


# A least-squares peak a little under the best point is noise; more than this is a model that
# does not describe the curve (t >= S/peak means no measured busbw can exceed the true peak).
PEAK_BELOW_MEASURED = 0.95


def _degenerate(points: int, latency_s: float, peak_gbps: float, measured_gbps: float, measured_size: int,
                latency_bound: bool) -> str | None:
    """Why this fit describes no real link, or None when it may."""
    if points < 2:
        return "one size cannot tell latency from bandwidth; measure a range of sizes, e.g. --sizes 1M-64M"
    if latency_bound:
        return (f"no size was bandwidth-bound: time hardly grows with size, so neither latency nor peak can be "
                f"told apart (best measured busbw {format_number(measured_gbps)} GB/s); measure larger sizes")
    if latency_s <= 0:
        return (f"the fitted latency is 0 (the line through the times meets size 0 at or below zero), which no "
                f"real link has: the times do not follow latency + size/bandwidth; measure more sizes or more --iters")
    if peak_gbps < PEAK_BELOW_MEASURED * measured_gbps:
        return (f"the fitted peak {format_number(peak_gbps)} GB/s is below the measured maximum {format_number(measured_gbps)} GB/s "
                f"at {measured_size} B: the times do not follow latency + size/bandwidth")
    return None


def _weighted_line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Intercept and slope minimizing sum(((a + b x) - y) / y)^2."""
    if len(xs) == 1:
        return 0.0, ys[0] / xs[0] if xs[0] else 0.0
    w = [1 / (y * y) for y in ys]
    sw = sum(w)
    sx = sum(wi * x for wi, x in zip(w, xs))
    sy = sum(wi * y for wi, y in zip(w, ys))
    sxx = sum(wi * x * x for wi, x in zip(w, xs))
    sxy = sum(wi * x * y for wi, x, y in zip(w, xs, ys))
    det = sw * sxx - sx * sx
    if det == 0 or not math.isfinite(det):
        return 0.0, sy / sx if sx else 0.0
    slope = (sw * sxy - sx * sy) / det
    intercept = (sy - slope * sx) / sw
    return intercept, slope
