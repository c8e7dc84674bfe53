"""The pictures of one probe's section in `microbench report`: a curve per op over the sizes
measured, every run overlaid; where an op was measured at one size only (memory, checkpoint,
dataload, a storage mount), bars against the expected value instead. Rows that cannot be drawn
are named under the pictures. No matplotlib raises RunError (exit 1): a report promised
pictures, not a page without them."""

from __future__ import annotations

import base64
from typing import Any

from ..core.errors import UsageError
from .html_parts import escape
from .report_summary import expected_for


def _img(png: bytes, alt: str) -> str:
    return f'<img class="plot" alt="{escape(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode("ascii")}">'


def section(name: str, items: list[tuple[str, dict[str, Any]]]) -> str:
    """`items`: (run label, record) of one step across runs."""
    from ..core.pyplot import pyplot
    from .plots import curve_name, draw, draw_bars, pick_metric, png_bytes, series

    usable = [
        (label, rec) for label, rec in items if any(isinstance(r.get("size_bytes"), int) for r in rec.get("rows", []))
    ]
    ops: list[str] = []
    for _, rec in usable:
        ops.extend(str(r.get("op")) for r in rec.get("rows", []) if str(r.get("op")) not in ops)
    images: list[Any] = []
    bars: dict[Any, Any] = {}
    notes: list[Any] = []
    for op in ops:
        per_op = [(label, {**rec, "rows": [r for r in rec.get("rows", []) if str(r.get("op")) == op]})
                  for label, rec in usable]
        # Each op its own primary metric: a storage record's read rows carry read_gbps and its
        # write rows write_gbps, so one metric for the section would plot one of them only.
        try:
            metric = pick_metric(next(rec for _, rec in per_op if rec["rows"]), None)
        except (UsageError, StopIteration):
            continue
        drawn = []
        for label, rec in per_op:
            skipped: list[str] = []
            if series(rec, metric, skipped):
                drawn.append((label, rec))
            notes += [f"{label}: {line}" for line in skipped]
        if not drawn:
            continue
        what = metric.removesuffix("_gbps")
        if max(len(pts) for _, rec in drawn for pts in series(rec, metric).values()) >= 2:
            # "read vs size", not "read read vs size": a storage op's metric is named after it.
            title = f"{name}: {op if what == op else f'{op} {what}'} vs size"
            plt = pyplot("the report's plots")
            images.append(_img(png_bytes(plt, draw(plt, drawn, metric, figsize=(5.6, 3.6), title=title)), title))
            continue
        unit = "GB/s (1e9 B/s)" if metric.endswith("_gbps") else metric
        for label, rec in drawn:
            keys = _split_keys(rec)
            for row in rec["rows"]:
                if isinstance(row.get(metric), (int, float)) and isinstance(row.get("size_bytes"), int):
                    exp = expected_for(rec, op, metric) or {}
                    text = curve_name(rec, row, keys)
                    bars.setdefault(unit, []).append(((f"{label}: " if len(items) > 1 else "") + text,
                                                      float(row[metric]), exp.get("gbps"), exp.get("unknown_why")))
    for unit, group in bars.items():
        plt = pyplot("the report's plots")
        title = f"{name}: one size per op"
        unknown = next((why for *_, why in group if why), None)
        fig = draw_bars(plt, [(label, value, expected) for label, value, expected, _ in group], unit, title=title,
                        unknown=unknown)
        images.append(_img(png_bytes(plt, fig), title))
    out = f'<div class="plots">{"".join(images)}</div>' if images else ""
    if notes:
        out += "".join(f'<p class="note">left out of the pictures: {escape(line)}</p>' for line in notes)
    return out


def _split_keys(record: dict[str, Any]) -> list[str]:
    """The case keys whose values differ among the record's rows: what a bar's label must say."""
    from ..core import registry

    rows = record.get("rows", [])
    return [k for k in registry.case_keys(record) if len({repr(r.get(k)) for r in rows}) > 1]
