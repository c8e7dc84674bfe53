"""`microbench report`: one self-contained HTML file for people who will not read JSON.

Everything is inside the file: CSS inline, plots as base64 PNG data URIs or inline SVG, no
scripts, no fetches, so it can be mailed, attached to a ticket or opened offline. It leads with
the answer, then the details: the summary (report_summary.py: per step its headline value,
expected value, share, verdict and a small picture), the runs, their environment, acceptance
verdicts (with --accept), hunt records, one section per probe in the suite's order (pictures:
report_plots.py; then each run's table), compare ratios of every run against the first, and the
composer's what-if tables when a compose record is given.

Sections are functions of one `Context` listed in SECTIONS, in page order; each returns its HTML,
or "" when it has nothing to show. A new section is one such function added to the list.
"""

from __future__ import annotations

import base64
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from ..core import registry
from ..core.errors import MicrobenchError, UsageError
from ..core.units import format_size
from ..results.outputs import check_new_file
from . import compare, report_job as job_html, report_plots, report_summary, rules as accept
from .html_parts import escape as _e, number as _num, table as _table

CSS = """
body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',sans-serif;margin:2em auto;max-width:1180px;
     color:#1d232a;padding:0 1em}
h1{font-size:1.7em;border-bottom:3px solid #2f6f9f;padding-bottom:.2em}
h2{font-size:1.3em;margin-top:2em;border-bottom:1px solid #ccd;padding-bottom:.15em}
h3{font-size:1.05em;margin:1.2em 0 .4em}
table{border-collapse:collapse;margin:.4em 0 1em;font-variant-numeric:tabular-nums}
th,td{border:1px solid #d5dae0;padding:.25em .6em;text-align:right;vertical-align:top}
th{background:#eef2f6}td:first-child,th:first-child{text-align:left}
td.l{text-align:left}.pass{color:#176b2c;font-weight:600}.fail{color:#b01d1d;font-weight:600}
.worse{background:#fde4e4}.better{background:#e3f5e8}.note{color:#5a6470}
img.plot{width:560px;max-width:100%;border:1px solid #e3e6ea}.plots{display:flex;flex-wrap:wrap;gap:8px}
table.env td{text-align:left}
table.summary td{vertical-align:middle}.small{font-size:.85em}svg.spark{display:block}
"""
# The browser itself enforces "no network fetches": only inline styles and data: images load.
CSP = ('<meta http-equiv="Content-Security-Policy" '
       'content="default-src \'none\'; img-src data:; style-src \'unsafe-inline\'">')


@dataclass
class Run:
    label: str
    path: Path
    kind: str                                      # "dir" | "file"
    records: dict[str, tuple[Path, dict[str, Any]]]


def load_runs(paths: Sequence[str]) -> list[Run]:
    if not paths:
        raise UsageError("no records given: expected suite directories or record files, "
                         "e.g. microbench report results/suite-* --out results/report.html")
    runs: list[Run] = []
    seen: set[str] = set()
    for raw in paths:
        kind, side = compare.load_side(raw)
        label = Path(raw).name if kind == "dir" else Path(raw).stem
        base, n = label, 1
        while label in seen:
            n += 1
            label = f"{base} ({n})"
        seen.add(label)
        runs.append(Run(label, Path(raw), kind, side))
    return runs


def check_out(path: str | os.PathLike | None) -> Path:
    """Refuse before any work: an existing file (reports, like records, are never overwritten)
    or a place this user cannot write. Without --out, a new report-<time>.html under results/."""
    if path is None:
        from ..results.store import DEFAULT_DIR

        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        names = (Path(DEFAULT_DIR) / f"report-{stamp}{'' if i == 0 else f'-{i}'}.html" for i in range(1000))
        path = next((p for p in names if not p.exists()), Path(DEFAULT_DIR) / f"report-{stamp}.html")
        return check_new_file(path, "--out", kept="reports", example="results/report.html", parents_made=True)
    return check_new_file(path, "--out", kept="reports", example="results/report.html")


# --------------------------------------------------------------------------- sections

def _env_rows(runs: list[Run]) -> list[list[str]]:
    def env(run: Run) -> dict[str, Any]:
        for _, record in run.records.values():
            if record.get("environment"):
                return record["environment"]
        return {}

    envs = [env(r) for r in runs]
    fields = [
        ("host", lambda e: e.get("hostname")),
        ("cpu", lambda e: e.get("cpu_model")),
        ("cpus", lambda e: e.get("cpu_count")),
        (
            "memory",
            lambda e: f"{(e.get('memory') or {}).get('total_bytes', 0) / 2**30:.1f} GiB" if e.get("memory") else None,
        ),
        ("os", lambda e: e.get("os")),
        ("kernel", lambda e: e.get("kernel")),
        ("python", lambda e: e.get("python")),
        ("microbench", lambda e: e.get("microbench")),
        ("torch", lambda e: e.get("torch")),
        ("nccl", lambda e: e.get("nccl")),
        ("cuda", lambda e: e.get("cuda")),
        ("gpus", lambda e: ", ".join(str(g.get("name", g)) for g in e.get("gpus") or []) or "none"),
        (
            "nics",
            lambda e: (
                ", ".join(
                    f"{n.get('name')} ({n.get('link')}, {n.get('speed_mbps') or '?'} Mb/s)"
                    for n in e.get("nics") or []
                    if n.get("link") != "loopback"
                )
                or None
            ),
        ),
        ("implementation", lambda e: (e.get("implementation") or {}).get("name")),
    ]
    return [[name, *[("-" if get(e) is None else str(get(e))) for e in envs]] for name, get in fields]


def _row_metrics(row: dict[str, Any], record: dict[str, Any]) -> dict[str, float]:
    values = compare.metrics_of(row, record)
    if _own_latency(row):
        values.pop("time_us", None)   # one p50 per size: the row's own, not its batch's
    return values


def _metric_columns(record: dict[str, Any]) -> list[str]:
    cols: list[str] = []
    for row in record.get("rows", []):
        cols.extend(k for k in _row_metrics(row, record) if k not in cols)
    return cols


_UNITS = (("_gbit_s", "Gbit/s"), ("_gbps", "GB/s"), ("_tflops", "TFLOP/s"), ("_us", "us"), ("_ms", "ms"), ("_s", "s"))


def _heading(metric: str) -> str:
    """A column's label from the naming rule (unit last, a percentile after it): busbw_gbps is
    "busbw GB/s", bw_gbit_s "bw Gbit/s", rtt_us_p50 "rtt p50 us"; time_us holds the p50."""
    if metric == "time_us":
        return "time p50 us"
    name, pct = metric, ""
    match = re.fullmatch(r"(.+)_(p\d+)", name)
    if match:
        name, pct = match.group(1), match.group(2)
    unit = ""
    for suffix, text in _UNITS:
        if name.endswith(suffix):
            name, unit = name[: -len(suffix)], text
            break
    name = "IOPS" if name == "iops" else name.replace("_", " ")
    return " ".join(x for x in (name, pct, unit) if x)


def _own_latency(row: dict[str, Any]) -> bool:
    """A row that states its own latency percentiles (link's rtt: over every round trip) times
    a batch per iteration, so its time_us p50 is not a latency to show beside them."""
    return any(compare._LATENCY.search(k) for k in row if k != "time_us")


def _probe_table(record: dict[str, Any]) -> str:
    rows = record.get("rows", [])
    if not rows:
        return '<p class="note">no rows (status: ' + _e(record.get("status")) + ")</p>"
    fields = compare.case_fields(record)
    differs = compare.varying(rows, fields)
    metrics = _metric_columns(record)
    body = [
        [
            compare.case_label(r, differs, fields),
            format_size(r["size_bytes"]) if isinstance(r.get("size_bytes"), int) else "-",
            *[_num(_row_metrics(r, record).get(m)) for m in metrics],
        ]
        for r in rows
    ]
    return _table(["case", "size", *[_heading(m) for m in metrics]], body)


def _acceptance(ctx: Context) -> str:
    parts = []
    for run in ctx.runs:
        verdicts = (ctx.verdicts or {}).get(run.label, [])
        passed = sum(v.status == "pass" for v in verdicts)
        cls = "pass" if passed == len(verdicts) else "fail"
        parts.append(f'<h3>{_e(run.label)}: <span class="{cls}">{passed} of {len(verdicts)} checks pass</span></h3>')
        rows = [[v.check.step, v.check.op, v.check.metric, v.status.upper(), v.detail] for v in verdicts]
        classes = [["", "", "", "pass" if v.status == "pass" else "fail", "l"] for v in verdicts]
        parts.append(_table(["step", "op", "metric", "verdict", "value"], rows, classes))
    return "".join(parts)


def _compare(runs: list[Run], rules: list[compare.Rule]) -> str:
    parts = []
    base = runs[0]
    for run in runs[1:]:
        parts.append(f"<h3>{_e(run.label)} vs {_e(base.label)}</h3>")
        try:
            result = compare.compare(base.path, run.path, rules)
        except MicrobenchError as exc:
            parts.append(f'<p class="note">not compared: {_e(exc)}</p>')
            continue
        for pair in result.pairs:
            rows, classes = [], []
            for line in pair.lines:
                ratio = line.ratio
                worse = ratio is not None and (ratio < 0.95 if compare.higher_is_better(line.metric) else ratio > 1.05)
                better = ratio is not None and (ratio > 1.05 if compare.higher_is_better(line.metric) else ratio < 0.95)
                rows.append(
                    [
                        f"{pair.name}: {line.case}",
                        format_size(line.size_bytes) if line.size_bytes is not None else "-",
                        _heading(line.metric),
                        _num(line.base),
                        _num(line.new),
                        f"{ratio:.3f}" if ratio is not None else "n/a",
                        ("FAIL " + ", ".join(line.failed)) if line.failed else "within noise" if line.noise else "",
                    ]
                )
                mark = "worse" if worse else "better" if better else ""
                classes.append(["", "", "", "", "", mark, "fail" if line.failed else ""])
            parts.append(_table(["case", "size", "metric", "base", "new", "new/base", "rule"], rows, classes))
        for why in result.skipped:
            parts.append(f'<p class="note">skipped {_e(why)}</p>')
    return "".join(parts)


def _compose(record: dict[str, Any]) -> str:
    """A compose record: the model and training setup, then one column per network (the what-if)."""
    cfg = record.get("config", {})
    model, train = cfg.get("model") or {}, cfg.get("train") or {}
    total = model.get("total_params", model.get("params", 0))
    head = (f"<p>{_e(model.get('name'))}: {float(total or 0) / 1e9:.2f} B params, {_e(model.get('layers'))} blocks, "
            f"{_e(train.get('ranks'))} ranks, {_e(train.get('tokens_per_rank'))} tokens/rank/micro-batch x "
            f"{_e(train.get('grad_accum'))}</p>")
    steps = [r for r in record.get("rows", []) if r.get("op") == "step"]
    parts = [("compute forward", "compute_fwd_s"), ("compute backward", "compute_bwd_s"),
             ("AllGather forward", "allgather_fwd_s"), ("AllGather backward", "allgather_bwd_s"),
             ("ReduceScatter", "reduce_scatter_s"), ("optimizer step", "optimizer_s"),
             ("step (overlapped)", "step_s"), ("tokens/s", "tokens_per_s")]
    table = [[label, *(_num(r.get(key)) for r in steps)] for label, key in parts]
    out = head + _table(["part (s)", *(str(r.get("network")) for r in steps)], table) if steps else head
    tiers = [[r.get("tier"), _num(r.get("write_gbps")), _num(r.get("save_s")), _num(r.get("load_s")),
              f"{r['young_daly_interval_s'] / 60:.0f}" if r.get("young_daly_interval_s") else "-"]
             for r in record.get("rows", []) if r.get("op") == "checkpoint"]
    if tiers:
        out += "<h3>checkpoint tiers</h3>" + _table(["tier", "write GB/s", "save s", "load s", "interval min"], tiers)
    return out + job_html.section(record, _table)    # the job's timelines and what-if, when it has a job


def _hunt(record: dict[str, Any]) -> str:
    """A hunt record: its verdict lines, the sender x receiver matrix and the heatmap."""
    from ..lab import hunt

    names = list((record.get("config") or {}).get("hosts") or [])
    index = {name: i for i, name in enumerate(names)}
    matrix = {(index[r["src"]], index[r["dst"]]): float(r[metric]) for r in record.get("rows", [])
              if r.get("src") in index and r.get("dst") in index and (metric := registry.row_metric(r, record))}
    slow = {
        (index[r["src"]], index[r["dst"]]) for r in record.get("rows", []) if r.get("slow") and r.get("src") in index
    }
    summary = record.get("summary") or {}
    lines = summary.get("verdict") or [f"record status {record.get('status')}: no verdict"]
    out = "".join(f'<p class="{"pass" if line.startswith("OK") else "fail"}">{_e(line)}</p>' for line in lines)
    if len(matrix) == len(names) * (len(names) - 1) and names:
        out += _table(["from \\ to", *names], hunt.matrix_table(matrix, names, slow))
        png = hunt.heatmap_png(matrix, names, slow, f"hunt: {len(names)} hosts, GB/s sender -> receiver")
        out += f'<img class="plot" alt="hunt heatmap" src="data:image/png;base64,{base64.b64encode(png).decode()}">'
    elif names:
        out += f'<p class="note">matrix incomplete ({len(matrix)} of {len(names) * (len(names) - 1)} directions)</p>'
    return out


# Records of tools, not probes: each has its own section below, not a probe's table and plot.
TOOL_KINDS = ("compose", "hunt")


@dataclass
class Context:
    """What every section reads: the runs, the --accept checks and --fail-on rules, and each
    run's acceptance results (by run label; None without --accept), computed once."""

    runs: list[Run]
    checks: list[accept.Check] | None = None
    rules: list[compare.Rule] = field(default_factory=list)
    verdicts: dict[str, list[Any]] | None = None
    fleet: dict[str, Any] | None = None     # a fleet record (`microbench fleet --json`)


def _summary(ctx: Context) -> str:
    return report_summary.section(ctx.runs, ctx.verdicts)


def _runs(ctx: Context) -> str:
    return "<h2>Runs</h2>" + _table(
        ["run", "path", "records", "status"],
        [[r.label, str(r.path), len(r.records),
          ", ".join(sorted({str(rec.get("status")) for _, rec in r.records.values()}))] for r in ctx.runs])


def _environment(ctx: Context) -> str:
    return "<h2>Environment</h2>" + _table(["", *[r.label for r in ctx.runs]], _env_rows(ctx.runs), cls="env")


def _acceptance_section(ctx: Context) -> str:
    return "<h2>Acceptance</h2>" + _acceptance(ctx) if ctx.checks else ""


def _hunts(ctx: Context) -> str:
    return "".join(f"<h2>Hunt: {_e(run.label)} <span class=\"note\">({_e(name)})</span></h2>" + _hunt(rec)
                   for run in ctx.runs for name, (_, rec) in run.records.items() if rec.get("kind") == "hunt")


def _probes(ctx: Context) -> str:
    """One section per suite step (or record file), whichever of its names each run's file has
    (an older run's collectives.json beside a newer nccl.json), titled as the first run names
    it, in the suite's order."""
    sections: dict[str, tuple[str, list[tuple[str, dict[str, Any]]]]] = {}
    for run in ctx.runs:
        for n, (_, rec) in run.records.items():
            if rec.get("kind") not in TOOL_KINDS:
                sections.setdefault(registry.step_key(n), (n, []))[1].append((run.label, rec))
    out = []
    for key in sorted(sections, key=report_summary.step_order):
        name, items = sections[key]
        kinds = sorted({str(rec.get("kind")) for _, rec in items})
        out.append(f"<h2>{_e(name)} <span class=\"note\">({_e(', '.join(kinds))})</span></h2>")
        out.append(report_plots.section(name, items))
        for label, record in items:
            impl = record.get("implementation", {})
            engine = impl.get("engine") or impl.get("name") or "-"
            out.append(f"<h3>{_e(label)} <span class=\"note\">engine {_e(engine)}, status {_e(record.get('status'))}"
                       f"</span></h3>" + _probe_table(record))
    return "".join(out)


def _fleet(ctx: Context) -> str:
    if ctx.fleet is None:
        return ""
    from .fleet import html as fleet_html

    return fleet_html.section(ctx.fleet, _table)


def _compare_section(ctx: Context) -> str:
    comparable = [r for r in ctx.runs if any(rec.get("kind") != "compose" for _, rec in r.records.values())]
    if len(comparable) < 2:
        return ""
    return ("<h2>Compare</h2>" + f"<p class=\"note\">every run against {_e(comparable[0].label)}; new/base "
            f"below 0.95 for a bandwidth (above 1.05 for a time) is marked worse</p>" + _compare(comparable, ctx.rules))


def _composer(ctx: Context) -> str:
    return "".join(f"<h2>Composer what-if: {_e(run.label)}</h2>" + _compose(rec)
                   for run in ctx.runs for _, (_, rec) in run.records.items() if rec.get("kind") == "compose")


# The page, in order: the answer first, then the details.
SECTIONS: list[Callable[[Context], str]] = [_summary, _fleet, _runs, _environment, _acceptance_section, _hunts, _probes,
                                            _compare_section, _composer]


def build(runs: list[Run], *, checks: list[accept.Check] | None = None,
          rules: list[compare.Rule] | None = None, generated: str | None = None,
          fleet: dict[str, Any] | None = None) -> str:
    generated = generated or time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    verdicts = ({run.label: accept.evaluate(checks, {name: rec for name, (_, rec) in run.records.items()})
                 for run in runs} if checks else None)
    ctx = Context(runs, checks, rules or [], verdicts, fleet)
    head = (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">{CSP}<title>microbench report</title>'
        f'<style>{CSS}</style></head><body><h1>microbench report</h1><p class="note">generated {_e(generated)}</p>'
    )
    return head + "".join(section(ctx) for section in SECTIONS) + "</body></html>\n"
