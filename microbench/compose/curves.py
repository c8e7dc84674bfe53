"""Measured collective curves, read from saved `nccl` records, as time-for-size functions.

Inside the measured range: log-log interpolation between neighbouring sizes. Outside it: the
latency-bandwidth model t = latency + S * factor / peak_busbw fitted to the same rows, and the
answer says so. A curve measured at another world size is rescaled with the same model,
because the busbw of a ring collective is (to first order) independent of the rank count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..errors import UsageError
from ..fit import fit_latency_bandwidth


def bus_factor(op: str, ranks: int) -> float:
    if op == "all_reduce":
        return 2.0 * (ranks - 1) / ranks
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (ranks - 1) / ranks
    return 1.0


def _measured(row: dict[str, Any]) -> bool:
    time_us, size = row.get("time_us"), row.get("size_bytes")
    p50 = time_us.get("p50") if isinstance(time_us, dict) else None
    return (isinstance(size, int) and not isinstance(size, bool) and size > 0
            and isinstance(p50, (int, float)) and not isinstance(p50, bool) and math.isfinite(p50) and p50 > 0)


@dataclass(frozen=True)
class Curve:
    op: str
    ranks: int
    points: tuple[tuple[int, float], ...]   # (size_bytes, time_s), ascending size
    latency_s: float
    peak_busbw_gbps: float
    source: str

    @classmethod
    def from_record(cls, record: dict[str, Any], op: str, source: str = "") -> "Curve":
        named = [r for r in record.get("rows", []) if r.get("op") == op]
        if not named:
            have = sorted({str(r.get("op")) for r in record.get("rows", [])})
            raise UsageError(f"the collective record {source or ''} has no {op!r} rows (it has: "
                             f"{', '.join(have) or 'none'}); re-run e.g. `microbench nccl --ops {op}`")
        # A row names its op whether or not it holds a usable time: only the latter make a curve.
        rows = [r for r in named if _measured(r)]
        if not rows:
            raise UsageError(f"the collective record {source or ''} has {len(named)} {op!r} row(s) but none with a "
                             f"measured time (size_bytes > 0 and time_us.p50 > 0, as `microbench nccl` writes); "
                             f"re-run e.g. `microbench nccl --ops {op}`")
        placements = {r.get("placement", "out") for r in rows}
        placement = "out" if "out" in placements else sorted(placements)[0]
        rows = sorted((r for r in rows if r.get("placement", "out") == placement), key=lambda r: r["size_bytes"])
        fit = fit_latency_bandwidth(rows)
        ranks = int(rows[0].get("ranks") or record.get("config", {}).get("world", {}).get("size", 0))
        return cls(op, ranks, tuple((r["size_bytes"], r["time_us"]["p50"] * 1e-6) for r in rows),
                   fit.get("latency_us", 0.0) * 1e-6, fit.get("peak_busbw_gbps", math.nan), source)

    def time_s(self, size_bytes: float, ranks: int | None = None) -> tuple[float, str]:
        """Predicted time for one collective of size_bytes (nccl-tests size convention) and a
        note on how it was obtained: 'measured', 'interpolated', 'extrapolated' or 'rescaled'."""
        ranks = ranks or self.ranks
        if ranks != self.ranks:
            return self._model(size_bytes, ranks), f"rescaled from {self.ranks} to {ranks} ranks"
        sizes = [p[0] for p in self.points]
        if size_bytes < sizes[0] or size_bytes > sizes[-1]:
            return self._model(size_bytes, ranks), "extrapolated with the fitted latency-bandwidth model"
        for size, t in self.points:
            if size == size_bytes:
                return t, "measured"
        for (s0, t0), (s1, t1) in zip(self.points, self.points[1:]):
            if s0 < size_bytes < s1:
                frac = math.log(size_bytes / s0) / math.log(s1 / s0)
                return math.exp(math.log(t0) + frac * (math.log(t1) - math.log(t0))), "interpolated"
        return self.points[-1][1], "measured"

    def _model(self, size_bytes: float, ranks: int) -> float:
        if ranks <= 1:
            return 0.0
        return self.latency_s + size_bytes * bus_factor(self.op, ranks) / (self.peak_busbw_gbps * 1e9)
