"""Did it get worse: two runs side by side, per op x size (or storage case), with ratios and
`--fail-on` rules (pytest-benchmark's --benchmark-compare-fail, for bandwidths).

Only like with like: two records are compared when they come from the same probe on the same
world size, dtype, backend, device and engine; otherwise the pair is skipped and the reason
said, because a ratio between a gloo run and an NCCL run is not a regression. Pure functions:
`load_side`, `parse_rule`, `compare` take paths/records and return data for the printer.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import UsageError
from .results import load_record
from .sizes import format_size, parse_number

# Fields that make two rows the same case; anything else (iters, per-rank times) is a result.
CASE_FIELDS = ("op", "size_bytes", "placement", "rw", "pattern", "bs_bytes", "threads", "qd", "streams",
               "batch", "concurrency", "objects", "part_size_bytes", "dtype", "redop", "root", "algo", "tool",
               "src", "dst")
# What must match for two records to be comparable, and where each lives in a record.
IDENTITY = (
    ("probe", lambda r: r.get("kind")),
    ("world size", lambda r: (r.get("config", {}).get("world") or {}).get("size")),
    ("dtype", lambda r: (r.get("config", {}).get("probe") or {}).get("dtype")),
    ("backend", lambda r: r.get("implementation", {}).get("backend")),
    ("device", lambda r: r.get("implementation", {}).get("device")),
    ("engine", lambda r: r.get("implementation", {}).get("engine")),
    ("storage", lambda r: r.get("implementation", {}).get("storage")),
    ("transport", lambda r: r.get("implementation", {}).get("transport")),
)
RULE_EXAMPLE = "--fail-on busbw:-5% (fail when busbw drops more than 5%)"


def metrics_of(row: dict[str, Any]) -> dict[str, float]:
    """Every number in a row that is a result worth a ratio: bandwidths, and p50 latencies."""
    out: dict[str, float] = {}
    for key, value in row.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if key.endswith("_gbps") and "ceiling" not in key:
            out[key] = float(value)
        elif key == "iops" or re.search(r"(_us|_ms)_p50$|^lat_p50_us$", key):
            out[key] = float(value)
    time_us = row.get("time_us")
    if isinstance(time_us, dict) and isinstance(time_us.get("p50"), (int, float)):
        out["time_us"] = float(time_us["p50"])
    return out


def higher_is_better(metric: str) -> bool:
    return metric.endswith("_gbps") or metric == "iops"


def default_metrics(available: dict[str, float]) -> list[str]:
    """What a table shows without rules: bandwidths (busbw rather than algbw: same ratio), or for
    a latency-only row (rtt) its p50."""
    bw = [k for k in available if k.endswith("_gbps")]
    if "busbw_gbps" in bw and "algbw_gbps" in bw:
        bw.remove("algbw_gbps")
    if bw:
        return bw
    lat = [k for k in available if k.endswith("_p50") or k == "lat_p50_us"]
    return lat or (["time_us"] if "time_us" in available else [])


def short_name(metric: str) -> str:
    return metric.removesuffix("_gbps").removesuffix("_us") if metric in ("time_us",) or metric.endswith("_gbps") else metric


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
    percent = parse_number(number, what="--fail-on", example="busbw:-5%", minimum=0.0)
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
    return {name: get(record) for name, get in IDENTITY}


def _case_key(row: dict[str, Any]) -> tuple:
    return tuple((k, row.get(k)) for k in CASE_FIELDS if k in row)


def _case_label(row: dict[str, Any], varying: dict[Any, set[str]]) -> str:
    extras = [f"{k}={row[k]}" for k in CASE_FIELDS
              if k in varying.get(row.get("op"), ()) and k not in ("op", "size_bytes") and k in row]
    return " ".join([str(row.get("op", "?")), *extras])


def _varying(rows: list[dict[str, Any]]) -> dict[Any, set[str]]:
    """Per op, the case fields that take more than one value: only those need naming."""
    by_op: dict[Any, list[dict[str, Any]]] = {}
    for row in rows:
        by_op.setdefault(row.get("op"), []).append(row)
    return {op: {k for k in CASE_FIELDS if len({repr(r.get(k)) for r in group}) > 1}
            for op, group in by_op.items()}


def compare_records(name: str, base: tuple[Path, dict[str, Any]], new: tuple[Path, dict[str, Any]],
                    rules: list[Rule]) -> tuple[PairResult | None, str | None]:
    """One pair -> (result, None), or (None, why it was skipped)."""
    (base_path, a), (new_path, b) = base, new
    ia, ib = identity_of(a), identity_of(b)
    differ = [f"{k} {ia[k]} vs {ib[k]}" for k in ia if ia[k] != ib[k]]
    if differ:
        return None, f"{name}: not like with like ({'; '.join(differ)})"
    result = PairResult(name, base_path, new_path, ia)
    for label, rec in (("BASE", a), ("NEW", b)):
        if rec.get("status") != "complete":
            result.notes.append(f"{label} record is {rec.get('status')}"
                                + (f" ({rec['status_reason']})" if rec.get("status_reason") else ""))
    rows_a = {_case_key(r): r for r in a.get("rows", [])}
    rows_b = {_case_key(r): r for r in b.get("rows", [])}
    varying = _varying(list(rows_a.values()) + list(rows_b.values()))
    for key, row in rows_a.items():
        if key not in rows_b:
            result.only_base.append(_case_label(row, varying) + _size_suffix(row))
            continue
        ma, mb = metrics_of(row), metrics_of(rows_b[key])
        result.metrics_seen.update(ma)
        shown = default_metrics(ma)
        for rule in rules:
            shown.extend(m for m in ma if rule.matches(m) and m not in shown)
        for metric in shown:
            if metric not in mb:
                continue
            ratio = mb[metric] / ma[metric] if ma[metric] else None
            failed = [r.text for r in rules if r.matches(metric) and ratio is not None and r.fails(metric, ratio)]
            result.lines.append(Line(_case_label(row, varying), row.get("size_bytes"), metric,
                                     ma[metric], mb[metric], ratio, failed))
    result.only_new = [_case_label(r, varying) + _size_suffix(r) for k, r in rows_b.items() if k not in rows_a]
    return result, None


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
        pairs = [(n, side_a[n], side_b[n]) for n in side_a if n in side_b]
        skipped = [f"{n}: only in BASE" for n in side_a if n not in side_b]
        skipped += [f"{n}: only in NEW" for n in side_b if n not in side_a]
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

