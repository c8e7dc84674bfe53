"""Latency-bandwidth model fitted to a measured curve: t(S) = latency + S*factor / peak_busbw.

Fitted by least squares on relative error (weights 1/t^2), so small and large sizes count
alike. A line that meets size 0 below zero is refitted through the origin: latency 0, times
proportional to size (a shaped link whose per-message cost is lost in its transfer time), which
is a model, not a failure. From it: peak bus bandwidth, latency, and the size that reaches half
the peak, where S*factor = latency * peak. Sizes at least four times that reach >= 80% of the
peak: those are the bandwidth-bound sizes whose measured busbw is averaged.

One criterion decides whether the model describes the curve: at every measured size, the
model's time must lie within what was measured there, from the fastest iteration to the slowest,
and at least FIT_TOLERANCE (10 %) either side of the median (so the busbw it gives is within
about 10 % of the measured busbw where the iterations agreed). The model's busbw never exceeds
its peak, so this is also the rule for a fitted peak below the best measured busbw: accepted
while that best point's measurement allows it (1.75 GB/s under 1.77, and 1.73 under 1.83,
alike), refused beyond. A curve that breaks it at any size (a link reshaped mid-run, busbw
falling with size), a latency-bound sweep (no size's transfer time shows) and a single size say
`fitted: False` and `not_fitted` (why); the model numbers stay in the dict (the composer
extrapolates with them and says so) but the printers show the reason, not the model.
"""

from __future__ import annotations

import math
from typing import Any

from .units import format_number, format_size


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
        spread = (
            r["time_us"].get("min", r["time_us"]["p50"]) * 1e-6,
            r["time_us"].get("max", r["time_us"]["p50"]) * 1e-6,
        )
        points.append((r["size_bytes"] * factor, t, r["size_bytes"], r["busbw_gbps"], factor, *spread))
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
    # latency-bound at every size the record holds: its best busbw is all we know of the peak.
    latency_bound = inv_bw <= 0 or inv_bw * largest[0] < 0.01 * largest[1]
    if latency_bound:
        peak = max(p[3] for p in points)
        inv_bw = 1 / (peak * 1e9)
        latency_s = max(0.0, min(p[1] - p[0] * inv_bw for p in points))
    elif latency_s < 0:
        latency_s, inv_bw = 0.0, _line_through_origin([p[0] for p in points], [p[1] for p in points])
    peak_gbps = 1 / inv_bw / 1e9
    factor = points[0][4] or 1.0
    half_size = latency_s * peak_gbps * 1e9 / factor
    bound = [p for p in points if p[2] >= 4 * half_size]
    basis = "sizes >= 4x the half-peak size"
    if not bound:
        bound, basis = [max(points, key=lambda p: p[2])], "largest size only (no size was bandwidth-bound)"
    measured_max = max(points, key=lambda p: p[3])
    worst = max((p for p in points if p[3] > 0), key=lambda p: _outside(p, latency_s, inv_bw))
    why = _not_described(len(points), latency_bound, measured_max[3], worst, latency_s, inv_bw)
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
        # How far the model strays from the busbw measured at its worst size, in %.
        "fit_max_error_pct": 100 * abs(_model_busbw(worst, latency_s, inv_bw) / worst[3] - 1),
    }


# The one criterion (module docstring): at every size the model's time within what was measured
# there, from the fastest iteration to the slowest, widened to this share of the median where
# the iterations agreed more closely. A quiet machine's repeats differ by a few %; the misfits it
# must refuse (busbw falling with size) are 20-50 % off at their ends.
FIT_TOLERANCE = 0.10

Point = tuple[float, float, int, float, float, float, float]   # x, t, size, busbw, factor, t min, t max


def _model_busbw(point: Point, latency_s: float, inv_bw: float) -> float:
    """The busbw (GB/s) the model gives at a measured point's size: size x factor over the
    model's time."""
    return point[0] / (latency_s + point[0] * inv_bw) / 1e9


def _window(point: Point) -> tuple[float, float]:
    """The times a model may give at this size: the measured range, at least +-10 % of the median."""
    return min(point[5], point[1] / (1 + FIT_TOLERANCE)), max(point[6], point[1] * (1 + FIT_TOLERANCE))


def _outside(point: Point, latency_s: float, inv_bw: float) -> float:
    """How far (a share) the model's time at this size falls outside its window; 0 inside."""
    model = latency_s + point[0] * inv_bw
    low, high = _window(point)
    return max(low / model - 1, model / high - 1, 0.0)


def _not_described(points: int, latency_bound: bool, measured_gbps: float, worst: Point, latency_s: float,
                   inv_bw: float) -> str | None:
    """Why this model does not describe the curve, or None when it does."""
    if points < 2:
        return "one size cannot tell latency from bandwidth; measure a range of sizes, e.g. --sizes 1M-64M"
    if latency_bound:
        return (f"no size was bandwidth-bound: time hardly grows with size, so neither latency nor peak can be "
                f"told apart (best measured busbw {format_number(measured_gbps)} GB/s); measure larger sizes")
    if _outside(worst, latency_s, inv_bw) > 0:
        low, high = _window(worst)
        measured = (format_number(worst[0] / high / 1e9), format_number(worst[0] / low / 1e9))
        return (f"at {format_size(worst[2])} the model gives {format_number(_model_busbw(worst, latency_s, inv_bw))} "
                f"GB/s busbw, outside the {measured[0]}-{measured[1]} GB/s measured there (its iterations' range, at "
                f"least {100 * FIT_TOLERANCE:.0f} % either side of the median {format_number(worst[3])} GB/s): "
                f"the times do not follow latency + size/bandwidth")
    return None


def _line_through_origin(xs: list[float], ys: list[float]) -> float:
    """The slope b minimizing sum((b x - y) / y)^2: the line with no latency."""
    den = sum((x / y) ** 2 for x, y in zip(xs, ys, strict=True))
    return sum(x / y for x, y in zip(xs, ys, strict=True)) / den if den else 0.0


def _weighted_line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Intercept and slope minimizing sum(((a + b x) - y) / y)^2."""
    if len(xs) == 1:
        return 0.0, ys[0] / xs[0] if xs[0] else 0.0
    w = [1 / (y * y) for y in ys]
    sw = sum(w)
    sx = sum(wi * x for wi, x in zip(w, xs, strict=True))
    sy = sum(wi * y for wi, y in zip(w, ys, strict=True))
    sxx = sum(wi * x * x for wi, x in zip(w, xs, strict=True))
    sxy = sum(wi * x * y for wi, x, y in zip(w, xs, ys, strict=True))
    det = sw * sxx - sx * sx
    if det == 0 or not math.isfinite(det):
        return 0.0, sy / sx if sx else 0.0
    slope = (sw * sxy - sx * sy) / det
    intercept = (sy - slope * sx) / sw
    return intercept, slope
