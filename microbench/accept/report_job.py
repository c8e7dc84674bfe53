"""The job section of a compose record in the HTML report: the timeline of each
configuration as one horizontal bar (a colour per phase kind, drains that overlap training as a
thin strip under the bar), on one time scale, then the ranked what-if as a table and the
recommendation. Inline SVG: no script, no fetch (the report's CSP allows it)."""

from __future__ import annotations

import html
import math
from typing import Any

from ..compose.job.timeline import KINDS
from ..compose.report import format_time

COLOURS = {"model_load": "#8e6bbf", "train": "#4c9f70", "data_stall": "#e0a03a", "ckpt_blocking": "#d1495b",
           "ckpt_wait": "#7a1f2b", "ckpt_drain": "#8fb3d9", "final_save": "#2f6f9f"}
LABELS = {"model_load": "model load", "train": "training", "data_stall": "data stall",
          "ckpt_blocking": "checkpoint (blocking)", "ckpt_wait": "wait for previous checkpoint",
          "ckpt_drain": "drain (overlapped)", "final_save": "final save until durable"}
LABEL_W, BAR_W, ROW_H = 380, 620, 18


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _label(c: dict[str, Any]) -> str:
    return f"{c['network']} · data {c['data']} · model {c['model_from']} · ckpt {c['ckpt_to']}"


KEYS = ("network", "data", "model_from", "ckpt_to")


def _same(a: dict[str, Any], b: dict[str, Any] | None) -> bool:
    return b is not None and bool(b) and all(a.get(k) == b.get(k) for k in KEYS)


def _chosen(job: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Per network (fastest first): the fastest configuration per checkpoint tier, allowed and
    marked apart (the data tier rarely changes a total: its variants would repeat one bar), and
    the recommended and the worst wherever they fall."""
    timelines = job.get("timelines") or []
    configs = [dict(c, timeline=timelines[c["timeline"]]) for c in job.get("configurations") or []
               if isinstance(c.get("timeline"), int) and 0 <= c["timeline"] < len(timelines)]
    seen: set[tuple[str, str, bool]] = set()
    out: dict[str, list[dict[str, Any]]] = {}
    for c in configs:                     # sorted by total already
        key = (c["network"], c["ckpt_to"], bool(c.get("marks")))
        if key not in seen or _same(c, job.get("recommended")) or _same(c, job.get("worst")):
            seen.add(key)
            group = out.setdefault(c["network"], [])
            if c not in group:
                group.append(c)
    return out


def timeline_svg(job: dict[str, Any]) -> str:
    groups = _chosen(job)
    if not groups:
        return ""
    rec = job.get("recommended") or {}
    rows = sum(len(g) for g in groups.values())
    height = 24 * len(groups) + ROW_H * rows + 40
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{LABEL_W + BAR_W + 150}" height="{height}" '
           f'role="img" aria-label="job timelines" style="font:12px system-ui,sans-serif">']
    y = 0
    for network, configs in groups.items():
        # One time axis per network: storage choices stay visible beside a much slower network.
        span = max(c["timeline"]["total_s"] for c in configs) or 1.0
        bottom = y + 20 + ROW_H * len(configs)
        out.append(f'<text x="4" y="{y + 14}" font-weight="600">{_e(network)}</text>')
        for i in range(5):
            x = LABEL_W + BAR_W * i / 4
            out.append(
                f'<line x1="{x:.1f}" y1="{y + 18}" x2="{x:.1f}" y2="{bottom}" stroke="#d5dae0"/><text '
                f'x="{x:.1f}" y="{y + 14}" text-anchor="middle" fill="#5a6470">{_e(format_time(span * i / 4))}</text>'
            )
        y += 20
        for c in configs:
            is_rec, marked = _same(c, rec), bool(c.get("marks"))
            colour = "#176b2c" if is_rec else "#9aa3ad" if marked else "#1d232a"
            out.append(f'<text x="{LABEL_W - 6}" y="{y + 12}" text-anchor="end" fill="{colour}">'
                       f'{_e(("★ " if is_rec else "") + _label(c))}</text><g opacity="{0.45 if marked else 1}">')
            tl = c["timeline"]
            for p in tl["phases"]:
                x, w = LABEL_W + BAR_W * p["start_s"] / span, max(BAR_W * p["time_s"] / span, 0.5)
                if p.get("kind") == "repeat":   # identical periods folded in the record: their first, tiled
                    out.append(_tiled(p, x, w, y, span, f"p{len(out)}"))
                    continue
                top, h = (y + 13, 3) if p.get("overlapped") else (y + 2, 11)
                out.append(f'<rect x="{x:.2f}" y="{top}" width="{w:.2f}" height="{h}" fill="{COLOURS[p["kind"]]}">'
                           f'<title>{_e(p["name"])}: {_e(format_time(p["time_s"]))}</title></rect>')
            end = LABEL_W + BAR_W * tl["total_s"] / span
            # why it is marked, where there is room after the bar
            why = ("" if not marked else f" (marked: {'; '.join(c['marks'])})" if end < LABEL_W + BAR_W * 0.6
                   else " (marked)")
            out.append(f'</g><text x="{end + 4:.1f}" y="{y + 12}" fill="#5a6470">'
                       f'{_e(format_time(tl["total_s"]) + why)}</text>')
            y += ROW_H
        y += 4
    y += 8
    x = 4
    for kind in KINDS:
        out.append(f'<rect x="{x}" y="{y}" width="12" height="12" fill="{COLOURS[kind]}"/>'
                   f'<text x="{x + 16}" y="{y + 10}">{_e(LABELS[kind])}</text>')
        x += 26 + 7 * len(LABELS[kind])
    out.append("</svg>")
    return "".join(out)


def _tiled(p: dict[str, Any], x: float, w: float, y: float, span: float, ident: str) -> str:
    """A folded run of identical periods: one rect filled with a pattern of its first period."""
    tile = max(BAR_W * p["period_s"] / span, 1e-3)
    cells = []
    for q in p.get("template") or []:
        qx, qw = BAR_W * q["start_s"] / span, max(BAR_W * q["time_s"] / span, 0.05)
        top, h = (13, 3) if q.get("overlapped") else (2, 11)
        cells.append(
            f'<rect x="{qx:.3f}" y="{top}" width="{qw:.3f}" height="{h}" fill="{COLOURS.get(q["kind"], "#999")}"/>'
        )
    return (f'<defs><pattern id="{ident}" patternUnits="userSpaceOnUse" x="{x:.3f}" y="{y}" width="{tile:.4f}" '
            f'height="{ROW_H}">{"".join(cells)}</pattern></defs><rect x="{x:.2f}" y="{y}" width="{w:.2f}" '
            f'height="16" fill="url(#{ident})"><title>{_e(p["name"])}: {_e(format_time(p["time_s"]))}</title></rect>')


def section(record: dict[str, Any], table: Any) -> str:
    """The job part of a compose record's section; `table(headers, rows)` is the report's."""
    job = (record.get("summary") or {}).get("job")
    if not isinstance(job, dict):
        return ""
    every = (
        f"a checkpoint every {job['ckpt_every']} steps" if job.get("ckpt_every") else "checkpoints per --ckpt-interval"
    )
    out = [f"<h3>the whole job: {_e(job.get('steps'))} steps, {_e(every)}, "
           f"{'async' if job.get('async_ckpt') else 'synchronous'} saves</h3>"]
    configs = job.get("configurations") or []
    shown = sum(len(g) for g in _chosen(job).values())
    out.append(f'<p class="note">one bar per configuration, one time scale per network ({shown} of {len(configs)}: '
               f'the fastest per checkpoint tier, the recommended ★ and the worst; every one is in the table below); '
               f'grey, faded: marked (an ephemeral checkpoint or a resume from another tier), never recommended; the '
               f'thin strip under a bar is a drain overlapping training</p>')
    out.append(timeline_svg(job))
    rec, worst, ratio = job.get("recommended"), job.get("worst"), job.get("end_to_end_ratio")
    if rec and worst and ratio:
        out.append(f'<p><b>recommended</b>: {_e(_label(rec))}: {_e(format_time(rec["total_s"]))}; worst '
                   f'{_e(_label(worst))}: {_e(format_time(worst["total_s"]))}; end to end {ratio:.2f}x</p>')
        flips = [[f["phase"], f["recommended"], f"{f['alternative']} {f['factor']:.2f}x faster" if f.get("factor")
                  else "no change up to 100x", ", ".join(f.get("ties") or []) or "-"] for f in job.get("flips") or []]
        out.append(table(["phase", "recommended", "to change the answer", "ties"], flips))
    rows = [r for r in record.get("rows", []) if r.get("op") == "job"]
    body = [
        [
            r["rank"],
            r["network"],
            r["data"],
            r["model_from"],
            r["ckpt_to"],
            r.get("ckpt_every") or "-",
            format_time(r["total_s"]) if r.get("total_s") is not None else "never trains",
            f"{r['ratio']:.2f}x" if r.get("ratio") else "-",
            f"{r['tokens_per_s']:,.0f}" if r.get("tokens_per_s") else "-",
            f"{r['io_share']:.0%}"
            if isinstance(r.get("io_share"), (int, float)) and math.isfinite(r["io_share"])
            else "-",
            "RECOMMENDED" if r.get("recommended") else r.get("marks") or "",
        ]
        for r in rows
    ]
    if body:
        out.append("<h3>what-if: every network x storage assignment, by total</h3>")
        out.append(table(["#", "network", "data", "model from", "ckpt to", "every", "total", "vs rec.", "tokens/s",
                          "I/O", "marks"], body))
    return "".join(out)
