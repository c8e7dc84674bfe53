"""Cluster acceptance: thresholds over suite records, each check pass or fail with the numbers.

A thresholds file (TOML, or JSON) lists checks:

    [[check]]
    step = "nccl"             # a suite step (or a former name of one: "collectives")
    op = "all_reduce"         # rows of this op ...
    metric = "busbw_gbps"     # ... this column (default: the probe's primary metric) ...
    min = 150.0               # ... must reach this (or `max =` must not exceed it)
    size = "256M"             # optional: the row at this size; default: the best row

A floor can be relative to what the hardware should give (the record's `expected`, from
sysfs/NVML or the lab's rate; or `expected = "24GB/s"` in the check itself, with a unit):

    min_fraction_of_expected = 0.8   # best busbw >= 80% of expected; unknown expected fails

Pure functions: `evaluate` takes loaded records and returns results for the printer.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import MISSING, dataclass, fields, is_dataclass, replace
from pathlib import Path
from typing import Any

from ..core import registry
from ..core.errors import UsageError
from ..core.jsonfile import load_json, read_text
from ..core.units import format_number, parse_bandwidth_bytes_per_s, parse_number, parse_size

MAX_FRACTION = 1.5  # above 150% of a hardware ceiling, the ceiling is what is wrong


@dataclass(frozen=True)
class Check:
    step: str
    op: str
    metric: str              # "": the primary metric the probe's spec declares for these rows
    min: float | None = None
    max: float | None = None
    size_bytes: int | None = None
    min_fraction_of_expected: float | None = None
    expected_gbps: float | None = None  # overrides the record's expectation


@dataclass(frozen=True)
class CheckResult:
    check: Check
    status: str        # pass | fail | missing
    value: float | None
    detail: str


def _toml_loads(text: str) -> dict[str, Any]:
    # tomllib is 3.11+; on 3.10 the same parser ships as tomli (a dependency there, pyproject).
    try:
        import tomllib
    except ModuleNotFoundError:
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ModuleNotFoundError:
            raise UsageError("reading a TOML thresholds file on Python 3.10 needs the tomli package "
                             "(pip install tomli), or give the thresholds as JSON, e.g. thresholds.json") from None
    return tomllib.loads(text)


def load_checks(path: str | Path) -> list[Check]:
    target = Path(path)
    expected = "acceptance thresholds in TOML or JSON, e.g. examples/acceptance-local.toml"
    if target.suffix == ".json":
        data = load_json(path, what="thresholds file", expected=expected)
    else:
        text = read_text(path, what="thresholds file", expected=expected)
        try:
            data = _toml_loads(text)
        except (ValueError, RecursionError) as exc:
            raise UsageError(f"thresholds file {str(path)!r} is not valid TOML: {exc}") from None
    example = 'e.g. step = "nccl", op = "all_reduce", metric = "busbw_gbps", min = 150'
    entries = data.get("check", []) if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise UsageError(f"thresholds file {str(path)!r} is not a list of [[check]] tables; {example}")
    checks = []
    for i, item in enumerate(entries):
        where = f"check #{i + 1} in {str(path)!r}"
        if not isinstance(item, dict):
            raise UsageError(f"{where} is not a table of step, op, metric and min or max; {example}")
        missing = [k for k in ("step", "op") if not isinstance(item.get(k), str)]
        if "metric" in item and not isinstance(item["metric"], str):
            missing.append("metric")
        if missing or not any(k in item for k in ("min", "max", "min_fraction_of_expected")):
            raise UsageError(f"{where} needs step, op, metric and min or max (or min_fraction_of_expected); "
                             f"step, op and metric as strings (without metric: the probe's primary one); {example}")
        bounds = {key: _bound(item[key], f"{where}: {key}") for key in ("min", "max") if key in item}
        check_known(item, bounds, where)
        checks.append(Check(item["step"], item["op"], item.get("metric", ""), bounds.get("min"), bounds.get("max"),
                            parse_size(str(item["size"]), what="check size") if "size" in item else None,
                            _fraction(item, where), _expected(item, where)))
    if not checks:
        raise UsageError(f"thresholds file {str(path)!r} has no [[check]] entries")
    return checks


KEYS = ("step", "op", "metric", "min", "max", "size", "min_fraction_of_expected", "expected")
# Latency columns a row may carry beside its probe's declared metrics (rtt_us_p50, lat_p50_us).
_LATENCY_COLUMN = re.compile(r"_us_p\d+$|^lat_p\d+_us$")


def check_known(item: dict[str, Any], bounds: dict[str, float], where: str) -> None:
    """What would otherwise be found only after the whole suite ran, or never: a key no check
    has (a typo like `mni = 150` would leave no bound), a step the suite does not run, a metric
    its probe's rows never carry, and a min above the max that no value can meet."""
    unknown = [k for k in item if k not in KEYS]
    if unknown:
        raise UsageError(f"unknown key {unknown[0]!r} in {where}: expected some of {', '.join(KEYS)}, "
                         f"e.g. min = 150")
    found = registry.suite_step(item["step"])
    if found is None:
        names = ", ".join(step.name for _, step in registry.suite_steps())
        raise UsageError(f"unknown step {item['step']!r} in {where}: expected one of {names}, e.g. step = \"nccl\"")
    spec = found[0]
    metric = item.get("metric")
    if metric and metric not in spec.metrics and not _LATENCY_COLUMN.search(metric):
        raise UsageError(f"unknown metric {metric!r} for step {item['step']!r} in {where}: its rows carry "
                         f"{', '.join(spec.metrics)}, e.g. metric = \"{spec.metrics[0]}\"")
    if "min" in bounds and "max" in bounds and bounds["min"] > bounds["max"]:
        raise UsageError(
            f"invalid bounds in {where}: min = {format_number(bounds['min'], 6)} is above "
            f"max = {format_number(bounds['max'], 6)}, "
            f"so no value can pass; e.g. min = 100, max = 200"
        )


def step_ops(spec: Any, step: Any) -> tuple[str, ...] | None:
    """The op names a suite step's rows carry: its declared ops, else its Config's `ops` option
    as the step sets it (or its default); None where neither says."""
    if step.ops:
        return tuple(step.ops)
    field = next((f for f in fields(spec.config) if f.name == "ops"), None) \
        if spec.config is not None and is_dataclass(spec.config) else None
    opt = field.metadata.get("option") if field is not None else None
    if opt is None:
        return None
    flag = opt.flag_for("ops")
    if flag in step.argv[:-1]:
        text = step.argv[step.argv.index(flag) + 1]
        return tuple(opt.parse(text, flag)) if opt.parse else tuple(text.split(","))
    assert field is not None   # opt came from it
    default: Any = field.default_factory() if field.default_factory is not MISSING else field.default
    return tuple(default)


def check_steps_run(checks: list[Check], steps: list[Any]) -> None:
    """Before a suite runs its steps: every check names a step it runs (--only may leave one out)
    and an op that step's rows carry. Found after the steps it was a failed acceptance (exit 1)."""
    chosen = {step.name: step for step in steps}
    for check in checks:
        found = registry.suite_step(check.step)
        if found is None:
            continue   # load_checks has refused it already
        spec, step = found
        if step.name not in chosen:
            raise UsageError(f"the check on step {check.step!r}, op {check.op!r}: --only leaves that step out; add it "
                             f"to --only, e.g. --only {','.join([*chosen, step.name])}")
        ops = step_ops(spec, step)
        if ops is not None and check.op not in ops:
            raise UsageError(f"the check on step {check.step!r}: op {check.op!r} is not one the step runs "
                             f"({', '.join(ops)}); e.g. op = \"{ops[0]}\"")


def _fraction(item: dict[str, Any], where: str) -> float | None:
    if "min_fraction_of_expected" not in item:
        return None
    raw = item["min_fraction_of_expected"]
    try:
        value = parse_number(raw if not isinstance(raw, bool) else str(raw), what="min_fraction_of_expected",
                             example="0.8", minimum=0, maximum=MAX_FRACTION, allow_minimum=False)
    except UsageError:
        raise UsageError(f"invalid min_fraction_of_expected {raw!r} in {where}: expected a number in "
                         f"(0, {format_number(MAX_FRACTION, 6)}], a share of the expected bandwidth, e.g. "
                         f"min_fraction_of_expected = 0.8") from None
    return value


def _expected(item: dict[str, Any], where: str) -> float | None:
    if "expected" not in item:
        return None
    raw = str(item["expected"])
    if raw.strip().startswith("-"):
        raise UsageError(f"invalid expected {raw!r} in {where}: must be a positive rate with a unit, "
                         f"e.g. expected = \"24GB/s\"")
    return parse_bandwidth_bytes_per_s(raw, what=f"expected in {where}") / 1e9


def expectation_for(check: Check, record: dict[str, Any]) -> dict[str, Any] | None:
    """The expected bandwidth a relative check is held against: the check's own, else the
    record's (per op for collectives, one for the whole run elsewhere)."""
    if check.expected_gbps is not None:
        return {"gbps": check.expected_gbps, "unknown_why": None, "limit": "the check's expected"}
    found = record.get("summary", {}).get("expected")
    if isinstance(found, dict) and "gbps" not in found:
        found = found.get(check.op)
    return found if isinstance(found, dict) else None


def _relative(check: Check, record: dict[str, Any], value: float) -> CheckResult:
    exp = expectation_for(check, record)
    assert check.min_fraction_of_expected is not None
    need = f"needs >= {100 * check.min_fraction_of_expected:.0f}% of expected"
    if exp is None:
        return CheckResult(
            check, "missing", value, f"{format_number(value)}; the record has no expected bandwidth ({need})"
        )
    if not exp.get("gbps"):
        return CheckResult(
            check, "missing", value, f"{format_number(value)}; expected unknown: {exp.get('unknown_why')}"
        )
    fraction = value / exp["gbps"]
    ok = fraction >= check.min_fraction_of_expected
    return CheckResult(
        check,
        "pass" if ok else "fail",
        value,
        f"{format_number(value)} = {100 * fraction:.0f}% of expected {format_number(exp['gbps'], 4)} GB/s ({need})",
    )


def _bound(value: Any, what: str) -> float:
    """A threshold: a finite number. A string or a boolean here is a typo, not a threshold that
    every value passes or fails."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise UsageError(f"invalid {what} = {json.dumps(value)}: expected a finite number in the metric's unit "
                         f"(GB/s for *_gbps), e.g. min = 150")
    return float(value)


def evaluate(checks: list[Check], records: dict[str, dict[str, Any] | None]) -> list[CheckResult]:
    """records: by step name or record file stem, of this suite or an older one (collectives)."""
    by_key = {registry.step_key(name): record for name, record in records.items()}
    results = []
    for check in checks:
        record = records.get(check.step) or by_key.get(registry.step_key(check.step))
        if record is None:
            results.append(CheckResult(check, "missing", None, f"step {check.step!r} produced no record"))
            continue
        if not check.metric:
            check = replace(
                check,
                metric=next(
                    filter(
                        None,
                        (registry.row_metric(r, record) for r in record.get("rows", []) if r.get("op") == check.op),
                    ),
                    "",
                ),
            )
        rows = [
            r
            for r in record.get("rows", [])
            if r.get("op") == check.op and isinstance(r.get(check.metric), (int, float))
        ]
        if check.size_bytes is not None:
            rows = [r for r in rows if r.get("size_bytes") == check.size_bytes]
        if not rows:
            results.append(CheckResult(check, "missing", None, f"no {check.op} rows with {check.metric or 'a metric'}"
                                       + (f" at {check.size_bytes} B" if check.size_bytes else "")))
            continue
        # "Best" means highest for a floor and lowest for a ceiling.
        values = [float(r[check.metric]) for r in rows]
        if check.min_fraction_of_expected is not None:
            results.append(_relative(check, record, max(values)))
            continue
        value = max(values) if check.min is not None else min(values)
        ok = (check.min is None or value >= check.min) and (check.max is None or value <= check.max)
        bound = (f">= {format_number(check.min, 6)}" if check.min is not None
                 else f"<= {format_number(check.max, 6)}" if check.max is not None else "")
        results.append(CheckResult(check, "pass" if ok else "fail", value, f"{format_number(value)} (needs {bound})"))
    return results
