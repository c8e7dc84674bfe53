"""The fleet section of the HTML report, from a fleet record: the fleet-wide findings, every
node's verdict, the lines that did not pass, the costs, and one strip plot per metric: one dot
per node along the metric's axis, the group's median drawn, the acceptance floor drawn where
there is one, and the nodes that failed or are inconclusive labelled. The plots are PNG data
URIs, as the report's other pictures are (no script, no fetch)."""

from __future__ import annotations

import base64
import html
import io
import math
from typing import Any, Callable

from ...core.pyplot import pyplot

COLOURS = {"PASS": "#4c78a8", "FAIL": "#c0392b", "INCONCLUSIVE": "#e0a03a", "FLEET": "#7f7f7f"}
MAX_LABELS = 12        # more outliers than this on one metric are the table's to list


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _num(value: Any) -> str:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return "-"
    return f"{value:.4g}" if math.isfinite(value) else str(value)


def load(path: str) -> dict[str, Any]:
    """A fleet record for the report's fleet section; any other record is refused (exit 2)."""
    from ...core.errors import UsageError
    from ...results import load_record

    record = load_record(path)
    if record.get("kind") != "fleet":
        raise UsageError(f"--fleet {path!r} is a {record.get('kind')!r} record; expected the record of "
                         f"`microbench fleet --json`, e.g. --fleet results/fleet.json")
    return record


def strip_png(metric: str, points: list[tuple[str, float, str]], median: float | None, floor: float | None,
              higher_better: bool) -> bytes:
    """One metric across the fleet: a dot per node (jittered up and down so close ones show),
    coloured by verdict, the outliers named."""
    plt = pyplot("the fleet's strip plots")
    fig, ax = plt.subplots(figsize=(5.6, 1.9), dpi=110)
    n = len(points)
    for verdict in sorted({v for _, _, v in points}):
        # A deterministic jitter (golden-ratio steps) spreads close values apart, the same every time.
        mine = [(i, value) for i, (_, value, v) in enumerate(points) if v == verdict]
        ax.scatter([value for _, value in mine], [((i * 0.618034) % 1.0 - 0.5) * 0.6 for i, _ in mine],
                   s=18 if n < 200 else 8, color=COLOURS.get(verdict, "#4c78a8"), zorder=3, edgecolors="none",
                   label=None)
    outliers = [(node, value, verdict) for node, value, verdict in points if verdict != "PASS"]
    for node, value, verdict in sorted(outliers, key=lambda p: p[1])[:MAX_LABELS]:
        ax.annotate(node, (value, 0.0), xytext=(0, 14), textcoords="offset points", ha="center", fontsize=7,
                    color=COLOURS.get(verdict, "#333"), arrowprops={"arrowstyle": "-", "color": "#999", "lw": 0.5})
    if median is not None:
        ax.axvline(median, color="#2f6f9f", lw=1, ls="-", label=f"median {median:.4g}")
    if floor is not None:
        ax.axvline(floor, color="#c0392b", lw=1.2, ls="--", label=f"floor {floor:.4g}")
    ax.set_yticks([])
    ax.set_ylim(-0.6, 0.9)
    ax.set_xlabel(f"{metric} ({'higher' if higher_better else 'lower'} is better)", fontsize=7)
    ax.tick_params(axis="x", labelsize=7)
    ax.set_title(f"{metric}: {n} node(s), {len(outliers)} not passing", fontsize=8)
    if median is not None or floor is not None:
        ax.legend(fontsize=6, loc="upper right", frameon=False)
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    return buffer.getvalue()


def _plots(rows: list[dict[str, Any]]) -> str:
    by_metric: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        if row.get("gate") in ("fleet", "pairs") and isinstance(row.get("value"), (int, float)):
            by_metric.setdefault(str(row.get("metric")), []).append(row)
    images = []
    for metric, group in sorted(by_metric.items()):
        medians = [r["median"] for r in group if isinstance(r.get("median"), (int, float))]
        floors = [r["floor"] for r in group if isinstance(r.get("floor"), (int, float))]
        median = sorted(medians)[len(medians) // 2] if medians else None
        png = strip_png(metric, [(str(r["node"]), float(r["value"]), str(r["verdict"])) for r in group], median,
                        floors[0] if floors else None, bool(group[0].get("higher_better", True)))
        images.append(f'<img class="plot" alt="{_e("strip plot: " + metric)}" '
                      f'src="data:image/png;base64,{base64.b64encode(png).decode("ascii")}">')
    return f'<div class="plots">{"".join(images)}</div>' if images else '<p class="note">no metric to plot</p>'


def section(record: dict[str, Any], table: Callable[..., str]) -> str:
    """The fleet section; `table(headers, rows, classes)` is the report's table maker."""
    summary = record.get("summary") or {}
    rows = [r for r in record.get("rows") or [] if isinstance(r, dict)]
    nodes = summary.get("nodes") or {}
    counts = ", ".join(f"{c} {v}" for v, c in (summary.get("verdicts") or {}).items())
    k = summary.get("k")
    out = [f"<h2>Fleet</h2><p>{len(nodes)} node(s): {_e(counts)}; k = {_e(_num(k))} from a budget of "
           f"{_e(summary.get('budget'))} false flag(s) over {_e(summary.get('tests'))} tests, minimum fraction "
           f"{_e(summary.get('min_fraction'))}</p>"]
    out += [f'<p class="note">{_e(note)}</p>' for note in summary.get("notes") or []]
    for finding in summary.get("findings") or []:
        command = f" (to bisect: <code>{_e(finding['command'])}</code>)" if finding.get("command") else ""
        out.append(f'<p class="fail">FLEET-WIDE {_e(finding.get("kind"))}: {_e(finding.get("text"))}{command}</p>')
    node_rows = [[n, r.get("verdict"), r.get("group") or "-", "; ".join(r.get("findings") or []) or "-"]
                 for n, r in nodes.items()]
    marks = [["", "pass" if r[1] == "PASS" else "fail", "", "l"] for r in node_rows]
    out.append("<h3>Nodes</h3>" + table(["node", "verdict", "group", "findings"], node_rows, marks))
    shown = sorted(
        (r for r in rows if r.get("verdict") != "PASS"), key=lambda r: (str(r.get("node")), str(r.get("metric")))
    )
    if shown:
        body = [[r.get("node"), r.get("verdict"), r.get("metric"), _num(r.get("value")), _num(r.get("median")),
                 _num(r.get("ratio")), _num(r.get("z")), r.get("device") or "-", r.get("reason") or ""] for r in shown]
        marks = [["", "fail", "", "", "", "", "", "l", "l"] for _ in shown]
        out.append("<h3>Not passing</h3>" + table(["node", "verdict", "metric", "value", "median", "ratio", "z",
                                                   "device", "reason"], body, marks))
    costs = summary.get("costs") or []
    if costs:
        out.append("<h3>What each failed node costs</h3>" + "".join(f"<p>{_e(c.get('text'))}</p>" for c in costs))
    out.append("<h3>Every metric across the fleet</h3>" + _plots(rows))
    return "".join(out)
