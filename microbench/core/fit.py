"""Latency-bandwidth model fitted to a measured curve: t(S) = latency + S*factor / peak_busbw.

Fitted by least squares on relative error (weights 1/t^2), so small and large sizes count
alike. From it: peak bus bandwidth, latency, and the size that reaches half the peak, where
S*factor = latency * peak. Sizes at least four times that reach >= 80% of the peak: those are
the bandwidth-bound sizes whose measured busbw is averaged.
"""

from __future__ import annotations

import math
from typing import Any


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
    return {
        "placement": placement,
        "points": len(points),
        "latency_us": latency_s * 1e6,
        "peak_busbw_gbps": peak_gbps,
        "half_peak_size_bytes": int(half_size),
        "avg_busbw_bw_bound_gbps": sum(p[3] for p in bound) / len(bound),
        "bw_bound_sizes": len(bound),
        "bw_bound_basis": basis,
        "peak_is_lower_bound": latency_bound,
    }


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
