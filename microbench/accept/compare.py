"""Did it get worse: two runs side by side, per op x size (or storage case), with ratios and
`--fail-on` rules (pytest-benchmark's --benchmark-compare-fail, for bandwidths).

Only like with like: two records are compared when they come from the same probe on the same
world size, dtype, backend, device and engine; otherwise the pair is skipped and the reason
said, because a ratio between a gloo run and an NCCL run is not a regression. Pure functions:
`load_side`, `parse_rule`, `compare` take paths/records and return data for the printer.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

from ..core import registry
from ..core.errors import UsageError
from ..core.units import format_size, parse_number
from ..results import load_record

# What every record must share with another to be compared; a probe's spec adds its own
# `identity_keys` (implementation fields such as the backend or the storage layer).
COMMON_IDENTITY = (
    ("probe", lambda r: getattr(registry.for_record(r), "name", None) or r.get("kind")),   # former kinds too
    ("world size", lambda r: (r.get("config", {}).get("world") or {}).get("size")),
    ("dtype", lambda r: (r.get("config", {}).get("probe") or {}).get("dtype")),
    ("device", lambda r: r.get("implementation", {}).get("device")),
    ("engine", lambda r: r.get("implementation", {}).get("engine")),
)
RULE_EXAMPLE = "--fail-on busbw:-5% (fail when busbw drops more than 5%)"
_LATENCY = re.compile(r"(_us|_ms)_p50$|^lat_p50_us$")


def _number(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def metrics_of(row: dict[str, Any], record: dict[str, Any] | None = None) -> dict[str, float]:
    """Every number in a row that is a result worth a ratio: the metric columns its probe
    declares, and p50 latencies."""
    spec = registry.row_spec(row, record)
    declared = spec.metrics if spec else registry.metric_columns()
    out = {key: float(row[key]) for key in declared if _number(row.get(key))}
    out.update({key: float(value) for key, value in row.items() if _LATENCY.search(key) and _number(value)})
    time_us = row.get("time_us")
    if isinstance(time_us, dict) and _number(time_us.get("p50")):
        out["time_us"] = float(time_us["p50"])
    return out


def higher_is_better(metric: str) -> bool:
    """Declared metrics are rates (GB/s, IOPS, TFLOP/s); latencies and times are lower-is-better."""
    return metric in registry.metric_columns() or metric.endswith("_gbps")


def default_metrics(available: dict[str, float], row: dict[str, Any] | None = None,
                    record: dict[str, Any] | None = None) -> list[str]:
    """What a table shows without rules: the row's primary metric (its probe's: busbw rather than
    algbw, which has the same ratio), or for a latency-only row (rtt) its p50."""
    primary = registry.row_metric(row, record) if row is not None else \
        next((m for m in registry.metric_columns() if m in available), None)
    if primary is not None and primary in available:
        return [primary]
    lat = [k for k in available if _LATENCY.search(k)]
    return lat or (["time_us"] if "time_us" in available else [])


def short_name(metric: str) -> str:
    return (
        metric.removesuffix("_gbps").removesuffix("_us")
        if metric in ("time_us",) or metric.endswith("_gbps")
        else metric
    )


# --------------------------------------------------------------------------- rules


@dataclass(frozen=True)
class Rule:
    text: str
    metric: str           # as written: busbw, busbw_gbps, time, rtt_us_p50 ...
    percent: float        # >= 0
    sign: str             # "-" fail on a drop, "+" fail on a rise, "" fail when worse

    def matches(self, metric: str) -> bool:
        return self.metric in (metric, short_name(metric))

    def fails(self, metric: str, ratio: float) -> bool:
        direction = self.sign or ("-" if higher_is_better(metric) else "+")
        limit = self.percent / 100.0
        return ratio < 1.0 - limit if direction == "-" else ratio > 1.0 + limit


_RULE_RE = re.compile(r"^\s*([A-Za-z][A-Za-z0-9_]*)\s*:\s*([+-]?)\s*([^%\s]+)\s*%\s*$")


def parse_rule(text: str) -> Rule:
    match = _RULE_RE.match(str(text))
    if not match:
        raise UsageError(f"invalid --fail-on {text!r}: expected METRIC:[+-]PERCENT%, e.g. {RULE_EXAMPLE}")
    metric, sign, number = match.groups()
    percent = parse_number(number, what="--fail-on", example="busbw:-5%", minimum=0.0, typed=str(text))
    if sign == "-" and percent >= 100:
        raise UsageError(f"invalid --fail-on {text!r}: a drop is less than 100%, e.g. {RULE_EXAMPLE}")
    return Rule(str(text).strip(), metric, percent, sign)


# --------------------------------------------------------------------------- inputs


def load_side(path: str | Path) -> tuple[str, dict[str, tuple[Path, dict[str, Any]]]]:
    """A record file, or a suite directory of STEP.json records -> ("file"|"dir", {name: (path, record)})."""
    target = Path(path)
    if target.is_dir():
        files = sorted(target.glob("*.json"))
        if not files:
            raise UsageError(f"{str(path)!r} holds no records (*.json); expected a record or a suite "
                             f"directory, e.g. results/suite-20261122-031100")
        return "dir", {f.stem: (f, load_record(f)) for f in files}
    record = load_record(target)
    return "file", {str(record.get("kind")): (target, record)}


# --------------------------------------------------------------------------- comparison


@dataclass
class Line:
    case: str
    size_bytes: int | None
    metric: str
    base: float
    new: float
    ratio: float | None
    failed: list[str] = field(default_factory=list)   # texts of the rules it broke
    lost: str | None = None   # NEW has no usable value here ("NaN in NEW", "missing in NEW")
    # Rules whose percentage it broke, not counted because the two runs' own spread covers the
    # change (see within_noise): printed as "within noise".
    noise: list[str] = field(default_factory=list)


@dataclass
class PairResult:
    name: str
    base_path: Path
    new_path: Path
    identity: dict[str, Any]
    lines: list[Line] = field(default_factory=list)
    only_base: list[str] = field(default_factory=list)
    only_new: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    metrics_seen: set[str] = field(default_factory=set)


@dataclass
class Comparison:
    pairs: list[PairResult]
    skipped: list[str]           # "NAME: why" for pairs not compared at all

    @property
    def failures(self) -> list[tuple[PairResult, Line]]:
        return [(p, line) for p in self.pairs for line in p.lines if line.failed]


def identity_of(record: dict[str, Any]) -> dict[str, Any]:
    spec = registry.for_record(record)
    keys = spec.identity_keys if spec else tuple(dict.fromkeys(k for s in registry.specs() for k in s.identity_keys))
    impl = record.get("implementation") or {}
    common = {name: get(record) for name, get in COMMON_IDENTITY}
    # The probe's own fields after what it runs on (dtype) and before how (device, engine), the
    # order a reader wants them in "not like with like (...)".
    head = dict(list(common.items())[:3])
    return {**head, **{k: impl.get(k) for k in keys}, **{k: v for k, v in common.items() if k not in head}}


def case_fields(record: dict[str, Any]) -> tuple[str, ...]:
    """The row fields that make two rows of this record's probe the same case. A record no probe
    claims (a tool's, such as hunt's src -> dst rows) is also told apart by its text fields."""
    keys = ("op", "size_bytes", *registry.case_keys(record))
    if registry.for_record(record) is None:
        keys += tuple(dict.fromkeys(k for row in record.get("rows", []) for k, v in row.items()
                                    if isinstance(v, str) and k not in keys))
    return keys


def _case_key(row: dict[str, Any], fields: tuple[str, ...]) -> tuple:
    return tuple((k, row.get(k)) for k in fields if k in row)


def case_label(row: dict[str, Any], varying: dict[Any, set[str]], fields: tuple[str, ...]) -> str:
    extras = [f"{k}={row[k]}" for k in fields
              if k in varying.get(row.get("op"), ()) and k not in ("op", "size_bytes") and k in row]
    return " ".join([str(row.get("op", "?")), *extras])


def varying(rows: list[dict[str, Any]], fields: tuple[str, ...]) -> dict[Any, set[str]]:
    """Per op, the case fields that take more than one value: only those need naming."""
    by_op: dict[Any, list[dict[str, Any]]] = {}
    for row in rows:
        by_op.setdefault(row.get("op"), []).append(row)
    return {op: {k for k in fields if len({repr(r.get(k)) for r in group}) > 1}
            for op, group in by_op.items()}


_MISSING = object()


def lost_value(base: Any, new: Any) -> str | None:
    """Why NEW has no usable value where BASE has a finite one ("missing in NEW", "NaN in NEW"),
    or None. Base values that are not finite have nothing to hold NEW to."""
    if not _number(base) or not math.isfinite(base):
        return None
    if new is _MISSING:
        return "missing in NEW"
    if not _number(new) or not math.isfinite(new):
        return f"{new} in NEW"
    return None


def compare_records(name: str, base: tuple[Path, dict[str, Any]], new: tuple[Path, dict[str, Any]],
                    rules: list[Rule]) -> tuple[PairResult | None, str | None]:
    """One pair -> (result, None), or (None, why it was skipped)."""
    (base_path, a), (new_path, b) = base, new
    ia, ib = identity_of(a), identity_of(b)
    differ = [f"{k} {ia.get(k)} vs {ib.get(k)}" for k in dict.fromkeys([*ia, *ib]) if ia.get(k) != ib.get(k)]
    if differ:
        return None, f"{name}: not like with like ({'; '.join(differ)})"
    result = PairResult(name, base_path, new_path, ia)
    for label, rec in (("BASE", a), ("NEW", b)):
        if rec.get("status") != "complete":
            result.notes.append(f"{label} record is {rec.get('status')}"
                                + (f" ({rec['status_reason']})" if rec.get("status_reason") else ""))
    fields = case_fields(a)
    defaults = registry.case_defaults(a)
    rows_a = {_case_key({**defaults, **r}, fields): r for r in a.get("rows", [])}
    rows_b = {_case_key({**defaults, **r}, fields): r for r in b.get("rows", [])}
    differs = varying(list(rows_a.values()) + list(rows_b.values()), fields)
    for key, row in rows_a.items():
        if key not in rows_b:
            result.only_base.append(case_label(row, differs, fields) + _size_suffix(row))
            continue
        ma, mb = metrics_of(row, a), metrics_of(rows_b[key], b)
        result.metrics_seen.update(ma)
        shown = default_metrics(ma, row, a)
        for rule in rules:
            shown.extend(m for m in ma if rule.matches(m) and m not in shown)
        for metric in shown:
            gated = [r.text for r in rules if r.matches(metric)]
            lost = lost_value(ma.get(metric), mb.get(metric, _MISSING))
            if lost:
                # A gate that cannot measure the new run has not passed it: NaN compares false
                # with every limit, and a dropped column has nothing to compare.
                if gated:
                    result.lines.append(Line(case_label(row, differs, fields), row.get("size_bytes"), metric,
                                             ma[metric], math.nan, None, gated, lost=lost))
                continue
            ratio = mb[metric] / ma[metric] if ma[metric] else None
            broken = [r.text for r in rules if r.matches(metric) and ratio is not None and r.fails(metric, ratio)]
            noisy = bool(broken) and within_noise(row, rows_b[key], metric)
            result.lines.append(
                Line(
                    case_label(row, differs, fields),
                    row.get("size_bytes"),
                    metric,
                    ma[metric],
                    mb[metric],
                    ratio,
                    [] if noisy else broken,
                    noise=broken if noisy else [],
                )
            )
    result.only_new = [case_label(r, differs, fields) + _size_suffix(r) for k, r in rows_b.items() if k not in rows_a]
    return result, None


# --------------------------------------------------------------------------- noise

NOISE_STATISTIC = "per-iteration time from its fastest iteration (min) to its slowest (max)"


def spread_us(row: dict[str, Any]) -> tuple[float, float] | None:
    """A row's per-iteration time range, (min, max) of time_us, or None when the row does not
    carry one (a record written without per-iteration times, a hand-made row)."""
    time_us = row.get("time_us")
    if not isinstance(time_us, dict):
        return None
    low, high = time_us.get("min"), time_us.get("max")
    if not (_number(low) and _number(high)) or not (0 < low <= high) or high != high:
        return None
    return float(low), float(high)


def within_noise(base_row: dict[str, Any], new_row: dict[str, Any], metric: str) -> bool:
    """True when the change of `metric` between the two rows is within what the two runs' own
    per-iteration spread allows: each run's range of iteration times, from its fastest to its
    slowest iteration, overlaps the other's. A real regression moves the new run's fastest
    iteration past every iteration of the base (and a real gain its slowest under the base's
    fastest). Why the whole range: on a shared machine the load moves between two runs by
    several times (back-to-back suites here differed 5x at 8 MiB while other tests ran), and
    while any iteration of the new run was as fast as one of the base, the machine, not the
    code, may explain the median; a 2x slower link moves every iteration (the lab test).

    Only for metrics the probes compute from time_us (rates from its p50, and time_us itself):
    a latency column such as rtt_us_p50 is its own statistic, judged by the rule alone."""
    if not (higher_is_better(metric) or metric == "time_us"):
        return False
    a, b = spread_us(base_row), spread_us(new_row)
    if a is None or b is None:
        return False
    return a[0] <= b[1] and b[0] <= a[1]


def _size_suffix(row: dict[str, Any]) -> str:
    return f" @ {format_size(row['size_bytes'])}" if isinstance(row.get("size_bytes"), int) else ""


def compare(base: str | Path, new: str | Path, rules: list[Rule] | None = None) -> Comparison:
    rules = rules or []
    kind_a, side_a = load_side(base)
    kind_b, side_b = load_side(new)
    if kind_a != kind_b:
        raise UsageError(f"cannot compare a {'directory' if kind_a == 'dir' else 'record'} with a "
                         f"{'directory' if kind_b == 'dir' else 'record'} ({str(base)!r} vs {str(new)!r}): "
                         f"give two records or two suite directories, e.g. compare results/suite-A results/suite-B")
    if kind_a == "file":
        (name_a, rec_a), = side_a.items()
        (name_b, rec_b), = side_b.items()
        pairs = [(name_a if name_a == name_b else f"{name_a} vs {name_b}", rec_a, rec_b)]
        skipped: list[str] = []
    else:
        # Steps pair by the registry's key, so an older directory's collectives.json meets nccl.json.
        keys_a = {registry.step_key(n): n for n in side_a}
        keys_b = {registry.step_key(n): n for n in side_b}
        pairs = [(n if n == keys_b[k] else f"{n} vs {keys_b[k]}", side_a[n], side_b[keys_b[k]])
                 for k, n in keys_a.items() if k in keys_b]
        skipped = [f"{n}: only in BASE" for k, n in keys_a.items() if k not in keys_b]
        skipped += [f"{n}: only in NEW" for k, n in keys_b.items() if k not in keys_a]
    results = []
    for name, a, b in pairs:
        result, why = compare_records(name, a, b, rules)
        if result is None:
            skipped.append(str(why))
        else:
            results.append(result)
    if not any(r.lines for r in results):
        reasons = "; ".join(skipped) or "no case appears in both"
        raise UsageError(f"nothing to compare between {str(base)!r} and {str(new)!r} ({reasons}); "
                         f"compare runs of the same probe, e.g. compare results/suite-A results/suite-B")
    for rule in rules:
        if not any(rule.matches(line.metric) for r in results for line in r.lines):
            names = sorted({short_name(m) for r in results for m in r.metrics_seen})
            raise UsageError(f"invalid --fail-on {rule.text!r}: no metric {rule.metric!r} in these records; "
                             f"they have {', '.join(names)} (e.g. {RULE_EXAMPLE})")
    return Comparison(results, skipped)

