"""Cluster acceptance: thresholds over suite records, each check pass or fail with the numbers.

A thresholds file (TOML, or JSON) lists checks:

    [[check]]
    step = "collectives"      # a suite step name
    op = "all_reduce"         # rows of this op ...
    metric = "busbw_gbps"     # ... this column ...
    min = 150.0               # ... must reach this (or `max =` must not exceed it)
    size = "256M"             # optional: the row at this size; default: the best row

Pure functions: `evaluate` takes loaded records and returns results for the printer.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import UsageError
from .sizes import parse_size


@dataclass(frozen=True)
class Check:
    step: str
    op: str
    metric: str
    min: float | None = None
    max: float | None = None
    size_bytes: int | None = None


@dataclass(frozen=True)
class CheckResult:
    check: Check
    status: str        # pass | fail | missing
    value: float | None
    detail: str


def load_checks(path: str | Path) -> list[Check]:
    target = Path(path)
    try:
        text = target.read_text()
    except OSError as exc:
        raise UsageError(f"cannot read thresholds file {str(path)!r}: {exc.strerror}") from None
    try:
        if target.suffix == ".json":
            data = json.loads(text)
        else:
            import tomllib

            data = tomllib.loads(text)
    except (ValueError, ImportError) as exc:
        raise UsageError(f"thresholds file {str(path)!r} is not valid {target.suffix.lstrip('.') or 'TOML'}: {exc}") from None
    example = 'e.g. step = "collectives", op = "all_reduce", metric = "busbw_gbps", min = 150'
    entries = data.get("check", []) if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise UsageError(f"thresholds file {str(path)!r} is not a list of [[check]] tables; {example}")
    checks = []
    for i, item in enumerate(entries):
        where = f"check #{i + 1} in {str(path)!r}"
        if not isinstance(item, dict):
            raise UsageError(f"{where} is not a table of step, op, metric and min or max; {example}")
        missing = [k for k in ("step", "op", "metric") if not isinstance(item.get(k), str)]
        if missing or ("min" not in item and "max" not in item):
            raise UsageError(f"{where} needs step, op, metric and min or max (step, op and metric as strings); {example}")
        bounds = {key: _bound(item[key], f"{where}: {key}") for key in ("min", "max") if key in item}
        checks.append(Check(item["step"], item["op"], item["metric"], bounds.get("min"), bounds.get("max"),
                            parse_size(str(item["size"]), what="check size") if "size" in item else None))
    if not checks:
        raise UsageError(f"thresholds file {str(path)!r} has no [[check]] entries")
    return checks


def _bound(value: Any, what: str) -> float:
    """A threshold: a finite number. A string or a boolean here is a typo, not a threshold that
    every value passes or fails."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise UsageError(f"invalid {what} = {json.dumps(value)}: expected a finite number in the metric's unit "
                         f"(GB/s for *_gbps), e.g. min = 150")
    return float(value)


def evaluate(checks: list[Check], records: dict[str, dict[str, Any] | None]) -> list[CheckResult]:
    results = []
    for check in checks:
        record = records.get(check.step)
        if record is None:
            results.append(CheckResult(check, "missing", None, f"step {check.step!r} produced no record"))
            continue
        rows = [r for r in record.get("rows", []) if r.get("op") == check.op and isinstance(r.get(check.metric), (int, float))]
        if check.size_bytes is not None:
            rows = [r for r in rows if r.get("size_bytes") == check.size_bytes]
        if not rows:
            results.append(CheckResult(check, "missing", None, f"no {check.op} rows with {check.metric}"
                                       + (f" at {check.size_bytes} B" if check.size_bytes else "")))
            continue
        # "Best" means highest for a floor and lowest for a ceiling.
        values = [float(r[check.metric]) for r in rows]
        value = max(values) if check.min is not None else min(values)
        ok = (check.min is None or value >= check.min) and (check.max is None or value <= check.max)
        bound = f">= {check.min:g}" if check.min is not None else f"<= {check.max:g}"
        results.append(CheckResult(check, "pass" if ok else "fail", value, f"{value:.3g} (needs {bound})"))
    return results
