"""The summary that opens `microbench report`: for every step (and op) of every run, the headline
value, what the hardware should give and the share of it, the verdict, and a small picture;
the details follow it.

The headline is the op's primary metric at its best size (accept/suite.best_per_op, the suite
table's column). The expected value is the one the record carries (summary.expected: per op for
collectives, one for the run elsewhere; bandwidths only), or unknown with the record's reason.
The verdict, in this order: SKIPPED or FAILED (the record's status and reason), WRONG (elements
that did not read back), then the acceptance checks given with --accept for that step and op
(PASS, FAIL, MISSING), else "no check": a measurement without a threshold is not judged here.
The picture is inline SVG: the headline metric against size, the value axis from zero, the
expected value dashed; a single size is a bar against the expected value.
"""

from __future__ import annotations

import math
from typing import Any

from ..core import registry
from ..core.units import format_number, format_size
from .html_parts import escape, table
from .suite import Best, best_label, best_per_op

SPARK_W, SPARK_H, BAR_H = 150, 34, 14
LINE, EXPECTED, ZERO = "#2f6f9f", "#b06a00", "#c8ced6"


def step_order(name: str) -> tuple[int, str]:
    """Where a step's section goes: the suite's order (memory, nccl, link, storage ...), then
    records no step writes, by name."""
    keys = [step.name for _, step in registry.suite_steps()]
    key = registry.step_key(name)
    return (keys.index(key) if key in keys else len(keys), name)


def expected_for(record: dict[str, Any], op: str, metric: str) -> dict[str, Any] | None:
    """The expectation a bandwidth is held against: the record's for the op, else its one for the
    run; None for a metric that is not a bandwidth, or a record that states none."""
    if not metric.endswith("_gbps"):
        return None
    found = (record.get("summary") or {}).get("expected")
    if isinstance(found, dict) and "gbps" not in found and "unknown_why" not in found:
        found = found.get(op)
    return found if isinstance(found, dict) else None


def verdict(record: dict[str, Any], op: str | None, results: list[Any] | None) -> tuple[str, str]:
    """(text, css class) for one op of one record; `results` are the run's acceptance results."""
    status = record.get("status")
    if status == "skipped":
        return f"SKIPPED: {record.get('status_reason') or 'no reason recorded'}", "note"
    if status != "complete":
        return f"FAILED ({status}): {record.get('status_reason') or 'no reason recorded'}", "fail"
    wrong = sum(r.get("nwrong") or 0 for r in record.get("rows", []) if str(r.get("op")) == op
                and isinstance(r.get("nwrong"), int))
    if wrong:
        return f"WRONG: {wrong} element(s) did not read back as written", "fail"
    skipped = [c for c in ((record.get("summary") or {}).get("skipped") or {}).get("cases", []) if c.get("op") == op]
    # A sweep that skipped cases (nccl: not enough memory) says so beside its verdict.
    also = ("; skipped " + ", ".join(f"{'out-of-place' if c.get('placement') == 'out' else 'in-place'} "
                                     f"{format_size(c.get('size_bytes', 0))}" for c in skipped)
            + f" ({record['summary']['skipped'].get('reason', 'no reason recorded')})") if skipped else ""
    mine = [v for v in results or [] if v.check.op == op]
    if not mine:
        return "no check" + also, "note"
    bad = [v for v in mine if v.status != "pass"]
    if not bad:
        return "PASS: " + "; ".join(v.detail for v in mine) + also, "pass"
    return f"{bad[0].status.upper()}: " + "; ".join(v.detail for v in bad) + also, "fail"


def curve(record: dict[str, Any], best: Best) -> list[tuple[int, float]]:
    """The best row's own curve: rows of its op whose case keys match it, by size."""
    keys = [k for k in registry.case_keys(record) if k != "size_bytes"]
    points = []
    for row in record.get("rows", []):
        value, size = row.get(best.metric), row.get("size_bytes")
        if (str(row.get("op")) == best.op and all(row.get(k) == best.row.get(k) for k in keys)
                and isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
                and isinstance(size, int) and not isinstance(size, bool) and size > 0):
            points.append((size, float(value)))
    return sorted(points)


def spark(points: list[tuple[int, float]], expected_gbps: float | None, what: str, scale: float = 0.0) -> str:
    """A small inline picture: the curve over size (log scale) from zero, or one bar; the
    expected value dashed. `scale`: the largest value of the step's pictures, so that its ops
    (and runs) read against each other. Empty for no points."""
    if not points:
        return ""
    top = max([v for _, v in points] + [expected_gbps or 0.0, scale]) * 1.08 or 1.0
    parts = [f'<svg class="spark" width="{SPARK_W}" height="{SPARK_H}" viewBox="0 0 {SPARK_W} {SPARK_H}" '
             f'role="img" aria-label="{escape(what)}"><title>{escape(what)}</title>']
    if len({s for s, _ in points}) < 2:
        value = points[-1][1]
        y = (SPARK_H - BAR_H) / 2
        parts.append(f'<rect x="0" y="{y:.1f}" width="{max(1.0, value / top * SPARK_W):.1f}" height="{BAR_H}" '
                     f'fill="{LINE}"/>')
        if expected_gbps:
            x = expected_gbps / top * SPARK_W
            parts.append(f'<line x1="{x:.1f}" y1="1" x2="{x:.1f}" y2="{SPARK_H - 1}" stroke="{EXPECTED}" '
                         f'stroke-width="2" stroke-dasharray="3,2"/>')
        parts.append(f'<line x1="0.5" y1="0" x2="0.5" y2="{SPARK_H}" stroke="{ZERO}"/>')
        return "".join(parts) + "</svg>"
    lo, hi = math.log2(points[0][0]), math.log2(points[-1][0])
    pad, height = 3.0, SPARK_H - 4.0

    def xy(size: int, value: float) -> str:
        x = pad + (math.log2(size) - lo) / (hi - lo) * (SPARK_W - 2 * pad)
        return f"{x:.1f},{SPARK_H - 2 - value / top * height:.1f}"

    parts.append(f'<line x1="0" y1="{SPARK_H - 1.5}" x2="{SPARK_W}" y2="{SPARK_H - 1.5}" stroke="{ZERO}"/>')
    if expected_gbps:
        y = SPARK_H - 2 - expected_gbps / top * height
        parts.append(f'<line x1="0" y1="{y:.1f}" x2="{SPARK_W}" y2="{y:.1f}" stroke="{EXPECTED}" '
                     f'stroke-dasharray="3,2"/>')
    parts.append(f'<polyline fill="none" stroke="{LINE}" stroke-width="1.6" '
                 f'points="{" ".join(xy(s, v) for s, v in points)}"/>')
    return "".join(parts) + "</svg>"


def _unit(metric: str) -> str:
    return "GB/s" if metric.endswith("_gbps") else metric


def _step_scale(bests: list[Best], record: dict[str, Any]) -> dict[str, float]:
    """The largest headline (and expected value) per unit among a step's ops and runs."""
    out: dict[str, float] = {}
    for best in bests:
        exp = expected_for(record, best.op, best.metric) or {}
        top = max(best.value, exp.get("gbps") or 0.0)
        out[_unit(best.metric)] = max(out.get(_unit(best.metric), 0.0), top)
    return out


def _headline(best: Best) -> str:
    """'busbw 1.72 GB/s at 16M' (the op has its own column)."""
    text = best_label(best, with_size=False).removeprefix(best.op).strip()
    size = best.size_bytes
    return text + (f" at {format_size(size)}" if isinstance(size, int) and not isinstance(size, bool) else "")


def _expected_cells(exp: dict[str, Any] | None, best: Best) -> tuple[str, str]:
    if exp is None:
        return "-", "-"
    if not exp.get("gbps"):
        return f'unknown<br><span class="note small">{escape(exp.get("unknown_why") or "")}</span>', "-"
    return (f"{escape(format_number(exp['gbps'], 4))} GB/s", f"{100 * best.value / exp['gbps']:.0f}%")


def section(runs: list[Any], verdicts: dict[str, list[Any]] | None) -> str:
    """The report's first section. `runs`: report.Run (label, records by step name);
    `verdicts`: each run's acceptance results by label (None without --accept)."""
    rows, classes = [], []
    many = len(runs) > 1
    by_step: dict[str, list[tuple[Any, str, dict[str, Any]]]] = {}
    for run in runs:
        for name, (_, record) in run.records.items():
            if registry.for_record(record) is not None:
                by_step.setdefault(registry.step_key(name), []).append((run, name, record))
    for step in sorted(by_step, key=step_order):
        for run, name, record in by_step[step]:
            results = [v for v in (verdicts or {}).get(run.label, [])
                       if registry.step_key(v.check.step) == registry.step_key(name)]
            bests = best_per_op(record) if record.get("status") == "complete" else []
            scale = _step_scale([b for _, _, rec in by_step[step] for b in best_per_op(rec)], record)
            each: list[Best | None] = [*bests] or [None]   # None: one row for a record without bests
            for best in each:
                op = best.op if best else None
                text, mark = verdict(record, op, results if verdicts is not None else None)
                label = [escape(step)] + ([escape(run.label)] if many else [])
                if best is None:
                    rows.append([*label, "-", "-", "-", "-", escape(text), ""])
                else:
                    exp = expected_for(record, best.op, best.metric)
                    expected, share = _expected_cells(exp, best)
                    picture = spark(curve(record, best), exp.get("gbps") if exp else None,
                                    f"{step}: {best_label(best)}", scale.get(_unit(best.metric), 0.0))
                    rows.append([*label, escape(best.op), escape(_headline(best)), expected, share, escape(text),
                                 picture])
                classes.append(["l"] * len(label) + ["l", "", "l", "", f"l {mark}", ""])
    if not rows:
        return ""
    headers = ["step", *(["run"] if many else []), "op", "headline (best size)", "expected", "% of expected",
               "verdict", "picture"]
    offset = 1 if many else 0
    return ("<h2>Summary</h2><p class=\"note\">Each step's headline: its primary metric at its best size, against "
            "what this hardware should give. Pictures: that metric over the sizes measured (a bar where one size "
            "was), from zero to the step's largest value, so a step's ops read against each other; dashed: "
            "expected. A verdict needs thresholds (--accept); without them a complete step says \"no check\". "
            "Details follow.</p>"
            + table(headers, rows, classes, cls="summary", raw=range(0, 8 + offset)))
