"""Measured collective curves, read from saved records of a probe whose spec feeds "network"
(the nccl probe), as time-for-size functions.

Inside the measured range: log-log interpolation between neighbouring sizes. Outside it: the
latency-bandwidth model t = latency + S * factor / peak_busbw fitted to the same rows, and the
answer says so. A curve measured at another world size is rescaled with the same model,
because the busbw of a ring collective is (to first order) independent of the rank count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from ..core import registry
from ..core.errors import UsageError
from ..core.fit import fit_latency_bandwidth
from ..core.jsonfile import finite_number, json_object
from ..core.units import bus_factor


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
    def synthetic(cls, op: str, busbw_gbps: float, latency_s: float, source: str) -> "Curve":
        """t = latency + size x bus factor / busbw at any world size: a network described, not measured."""
        return cls(op, 0, (), latency_s, busbw_gbps, source)

    @classmethod
    def from_record(cls, record: dict[str, Any], op: str, source: str = "", group: str = "world") -> "Curve":
        """The `op` rows of one group: `nccl --groups world,node,cross` keeps a curve per group
        (a row's `group`; rows without one are the world's, as every record before groups)."""
        all_rows = [r for r in record_rows(record, source) if r.get("group", "world") == group]
        named = [r for r in all_rows if r.get("op") == op]
        if not named:
            have = sorted({str(r.get("op")) for r in all_rows})
            where = "" if group == "world" else f" in its {group!r} group"
            raise UsageError(f"the collective record {source or ''} has no {op!r} rows{where} (it has: "
                             f"{', '.join(have) or 'none'}); re-run e.g. `microbench nccl --ops {op}`"
                             + ("" if group == "world" else f" --groups world,{group}"))
        for row in named:
            for key in [k for k in row if k.endswith("_gbps")]:
                # The fit divides by the bandwidths: a NaN here (a hand-edited or corrupted record)
                # is refused as --net ib=nanGB/s is, naming the row, not met as a crash in the fit.
                if row[key] is not None and not (finite_number(row[key]) and row[key] >= 0):
                    raise UsageError(f"the collective record {source or ''} has {key} = {row[key]!r} in its {op} "
                                     f"row at size_bytes {row.get('size_bytes')!r}; expected a finite number >= 0, "
                                     f"as `microbench nccl` writes: re-run it, or remove that row")
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
        if not self.points:
            return self._model(size_bytes, ranks), (
                f"from the synthetic curve (latency {self.latency_s * 1e6:g} us, "
                f"busbw {self.peak_busbw_gbps:g} GB/s, bus factor of {ranks} ranks)"
            )
        if ranks != self.ranks:
            return self._model(size_bytes, ranks), (f"rescaled from {self.ranks} to {ranks} ranks (fitted latency, "
                                                    f"same busbw, bus factor of {ranks} ranks)")
        sizes = [p[0] for p in self.points]
        if size_bytes < sizes[0] or size_bytes > sizes[-1]:
            return self._model(size_bytes, ranks), "extrapolated with the fitted latency-bandwidth model"
        for size, t in self.points:
            if size == size_bytes:
                return t, "measured"
        for (s0, t0), (s1, t1) in pairwise(self.points):
            if s0 < size_bytes < s1:
                frac = math.log(size_bytes / s0) / math.log(s1 / s0)
                return math.exp(math.log(t0) + frac * (math.log(t1) - math.log(t0))), "interpolated"
        return self.points[-1][1], "measured"

    def _model(self, size_bytes: float, ranks: int) -> float:
        if ranks <= 1:
            return 0.0
        return self.latency_s + size_bytes * bus_factor(self.op, ranks) / (self.peak_busbw_gbps * 1e9)


def record_rows(record: Any, source: str = "") -> list[dict[str, Any]]:
    """A record's rows, refusing anything that is not a list of objects (a hand-edited file)."""
    rows = record.get("rows") if isinstance(record, dict) else None
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        bad = rows if not isinstance(rows, list) else next(r for r in rows if not isinstance(r, dict))
        raise UsageError(f"record {source!r} has rows that are not objects (found {str(bad)[:40]!r}); "
                         f"expected a microbench record, e.g. one of results/suite-*/*.json")
    return rows


@dataclass(frozen=True)
class Network:
    """One network to predict over: its AllGather and ReduceScatter curves and what they came from."""

    name: str
    all_gather: Curve
    reduce_scatter: Curve
    source: str
    backend: str                      # nccl, gloo, ... or "synthetic"
    device: str                       # where the record ran: cuda, cpu, or "any"
    warnings: tuple[str, ...] = field(default=())
    # Two networks, NVLink in a node and NICs between nodes (compose/levels.py), when known: the
    # curves above are then the world collective (full sharding) and hybrid sharding uses these.
    levels: Any = None

    @property
    def latency_s(self) -> float:
        return self.all_gather.latency_s

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "source": self.source, "backend": self.backend, "device": self.device,
                "measured_ranks": self.all_gather.ranks or None, "latency_us": self.latency_s * 1e6,
                "peak_busbw_gbps": {"all_gather": self.all_gather.peak_busbw_gbps,
                                    "reduce_scatter": self.reduce_scatter.peak_busbw_gbps},
                "warnings": list(self.warnings),
                **({"levels": self.levels.describe()} if self.levels is not None else {})}


def synthetic_network(name: str, busbw_gbps: float, latency_s: float, text: str) -> Network:
    source = f"--net {text}"
    return Network(name, Curve.synthetic("all_gather", busbw_gbps, latency_s, source),
                   Curve.synthetic("reduce_scatter", busbw_gbps, latency_s, source), source, "synthetic", "any")


def network_from_record(record: dict[str, Any], name: str, source: str, *, allow_partial: bool = False,
                        for_gpus: bool = True) -> Network:
    spec = registry.for_record(record)
    if spec is None or "network" not in spec.feeds:
        feeders = registry.feeding("network")
        raise UsageError(f"--nccl {source!r} is a {record.get('kind')!r} record; expected a collective record "
                         f"(kind {' or '.join(repr(f.name) for f in feeders)}), e.g. a suite's results directory or "
                         f"the record of `microbench {' '.join(feeders[0].command) if feeders else 'nccl'}`")
    if record.get("status") != "complete" and not allow_partial:
        raise UsageError(f"--nccl {source!r} is a {record.get('status')!r} record (the sweep did not finish: "
                         f"{record.get('status_reason') or 'no reason recorded'}); re-run it, or pass --allow-partial")
    ag = Curve.from_record(record, "all_gather", source)
    rs = Curve.from_record(record, "reduce_scatter", source)
    impl = json_object(record.get("implementation"))
    backend = str(impl.get("backend") or record.get("config", {}).get("world", {}).get("backend") or "unknown")
    device = str(impl.get("device") or "unknown")
    warnings = []
    if record.get("status") != "complete":
        warnings.append(f"{name}: {source} is a {record.get('status')} record (--allow-partial): its curve "
                        f"stops where the sweep stopped")
    if for_gpus and (backend == "gloo" or device == "cpu"):
        warnings.append(f"{name}: {source} was measured with {backend} on {device}; used to predict GPUs, it "
                        f"describes that CPU path, not NCCL over the same wires")
    return Network(name, ag, rs, source, backend, device, tuple(warnings))
