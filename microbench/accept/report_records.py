"""The HTML of one record in `microbench report`: a probe's table (a column per metric, headed as
the naming rule reads it), a compose record's what-if tables, a hunt's matrix and heatmap."""

from __future__ import annotations

import base64
import re
from typing import Any

from ..core import registry
from ..core.units import format_size
from . import compare, report_job as job_html
from .html_parts import escape as _e, number as _num, table as _table


def _row_metrics(row: dict[str, Any], record: dict[str, Any]) -> dict[str, float]:
    values = compare.metrics_of(row, record)
    if _own_latency(row):
        values.pop("time_us", None)  # one p50 per size: the row's own, not its batch's
    return values


def _metric_columns(record: dict[str, Any]) -> list[str]:
    cols: list[str] = []
    for row in record.get("rows", []):
        cols.extend(k for k in _row_metrics(row, record) if k not in cols)
    return cols


_UNITS = (("_gbit_s", "Gbit/s"), ("_gbps", "GB/s"), ("_tflops", "TFLOP/s"), ("_us", "us"), ("_ms", "ms"), ("_s", "s"))


def heading(metric: str) -> str:
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


def probe_table(record: dict[str, Any]) -> str:
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
    return _table(["case", "size", *[heading(m) for m in metrics]], body)


def compose_record(record: dict[str, Any]) -> str:
    """A compose record: the model and training setup, then one column per network (the what-if)."""
    cfg = record.get("config", {})
    model, train = cfg.get("model") or {}, cfg.get("train") or {}
    total = model.get("total_params", model.get("params", 0))
    head = (
        f"<p>{_e(model.get('name'))}: {float(total or 0) / 1e9:.2f} B params, {_e(model.get('layers'))} blocks, "
        f"{_e(train.get('ranks'))} ranks, {_e(train.get('tokens_per_rank'))} tokens/rank/micro-batch x "
        f"{_e(train.get('grad_accum'))}</p>"
    )
    steps = [r for r in record.get("rows", []) if r.get("op") == "step"]
    parts = [
        ("compute forward", "compute_fwd_s"),
        ("compute backward", "compute_bwd_s"),
        ("AllGather forward", "allgather_fwd_s"),
        ("AllGather backward", "allgather_bwd_s"),
        ("ReduceScatter", "reduce_scatter_s"),
        ("optimizer step", "optimizer_s"),
        ("step (overlapped)", "step_s"),
        ("tokens/s", "tokens_per_s"),
    ]
    table = [[label, *(_num(r.get(key)) for r in steps)] for label, key in parts]
    out = head + _table(["part (s)", *(str(r.get("network")) for r in steps)], table) if steps else head
    tiers = [
        [
            r.get("tier"),
            _num(r.get("write_gbps")),
            _num(r.get("save_s")),
            _num(r.get("load_s")),
            f"{r['young_daly_interval_s'] / 60:.0f}" if r.get("young_daly_interval_s") else "-",
        ]
        for r in record.get("rows", [])
        if r.get("op") == "checkpoint"
    ]
    if tiers:
        out += "<h3>checkpoint tiers</h3>" + _table(["tier", "write GB/s", "save s", "load s", "interval min"], tiers)
    return out + job_html.section(record, _table)  # the job's timelines and what-if, when it has a job


def hunt_record(record: dict[str, Any]) -> str:
    """A hunt record: its verdict lines, the sender x receiver matrix and the heatmap."""
    from ..lab import hunt

    names = list((record.get("config") or {}).get("hosts") or [])
    index = {name: i for i, name in enumerate(names)}
    matrix = {
        (index[r["src"]], index[r["dst"]]): float(r[metric])
        for r in record.get("rows", [])
        if r.get("src") in index and r.get("dst") in index and (metric := registry.row_metric(r, record))
    }
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
