"""Bandwidth-vs-size curves from saved records, overlaid: where a picture beats a table
(1gbit vs unlimited, IB vs TCP, NVMe vs S3). matplotlib is a main dependency; without it a
plot fails (exit 1), see core/pyplot.py."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, TypeGuard

from ..core import registry
from ..core.errors import RunError, UsageError
from ..core.pyplot import pyplot
from ..core.units import format_number, format_size
from ..results.outputs import check_new_file


def _number(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def metric_choices(record: dict[str, Any]) -> list[str]:
    """The metric columns the record's rows carry, in its probe's order (the primary first). A
    record no probe claims (a former kind) offers every declared column it carries, or failing
    that its bandwidths."""
    carried: list[str] = []
    for row in record.get("rows", []):
        carried += [k for k, v in row.items() if _number(v) and k not in carried]
    spec = registry.for_record(record)
    out = [m for m in (spec.metrics if spec else registry.metric_columns()) if m in carried]
    return out or ([k for k in carried if k.endswith("_gbps")] if spec is None else [])


def pick_metric(record: dict[str, Any], metric: str | None) -> str:
    choices = metric_choices(record)
    if metric:
        if metric not in choices:
            raise UsageError(
                f"invalid --metric {metric!r}: this record has {', '.join(choices) or 'no metric columns'}"
            )
        return metric
    if not choices:
        if record.get("status") == "skipped":
            raise UsageError(f"the {record.get('kind', '?')!r} record has nothing to plot: the probe was skipped "
                             f"({record.get('status_reason') or 'no reason recorded'})")
        raise UsageError(f"the {record.get('kind', '?')!r} record has no metric columns to plot")
    return choices[0]


def series(record: dict[str, Any], metric: str, skipped: list[str] | None = None) -> dict[str, list[tuple[int, float]]]:
    """One (size, value) line per op and per value of the probe's case keys that split rows of
    one op and size (placement in/out, tool posix/fio), sizes ascending, each named in words
    ("all_gather, out-of-place", "write, 4 streams"). A row that carries `metric` but cannot be
    drawn (the value not a number, no positive size) is left out and described in `skipped`."""
    defaults = registry.case_defaults(record)
    rows = []
    for index, row in enumerate(record.get("rows", [])):
        if not isinstance(row, dict) or metric not in row:
            continue
        value, size = row.get(metric), row.get("size_bytes")
        if not _number(value) or not math.isfinite(value):
            why = f"{metric} is {value!r}, not a number"
        elif not _number(size) or isinstance(size, float) or size <= 0:
            why = f"size_bytes is {size!r}, not a positive whole number of bytes"
        else:
            rows.append({**defaults, **row})
            continue
        if skipped is not None:
            skipped.append(f"row {index} ({row.get('op', '?')}): {why}")
    groups: dict[tuple[str, Any], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault((str(row.get("op")), row["size_bytes"]), []).append(row)
    split = [k for k in registry.case_keys(record)
             if any(len({repr(r.get(k)) for r in group}) > 1 for group in groups.values())]
    out: dict[str, list[tuple[int, float]]] = {}
    named: dict[tuple[Any, ...], str] = {}
    for row in rows:
        variant = (str(row.get("op", "?")), *(repr(row.get(k)) for k in split))
        if variant not in named:
            name = curve_name(record, row, split)
            if name in named.values():   # two cases whose words agree: their values tell them apart
                name += " (" + ", ".join(f"{k} {row.get(k)}" for k in split) + ")"
            named[variant] = name
        out.setdefault(named[variant], []).append((int(row["size_bytes"]), float(row[metric])))
    return {k: sorted(v) for k, v in out.items()}


def curve_name(record: dict[str, Any], row: dict[str, Any], keys: list[str]) -> str:
    """The op, then in words what sets this case apart among `keys`: "write, 4 streams"."""
    words: list[str] = []
    for key in keys:
        text = case_words(record, key, row)
        if text and text not in words and text != row.get("op"):
            words.append(text)
    return ", ".join([str(row.get("op", "?")), *words])


def case_words(record: dict[str, Any], key: str, row: dict[str, Any]) -> str | None:
    """A case key's value in words for a legend: the probe's own (ProbeSpec.case_words), else
    the common reading of the key; None where the row has no value for it."""
    spec = registry.for_record(record)
    if spec is not None and spec.case_words is not None:
        own = spec.case_words(key, row)
        if own:
            return own
    value = row.get(key)
    if value is None:
        return None
    if key in _WORDS and str(value) in _WORDS[key]:
        return _WORDS[key][str(value)]
    if key in _COUNTED and _number(value):
        return f"{format_number(value, 6)} {_COUNTED[key]}{'' if value == 1 else 's'}"
    if key.endswith("_bytes") and _number(value):
        return f"{format_size(value)} {_SIZED.get(key, key.removesuffix('_bytes').replace('_', ' '))}"
    if key == "group":
        return f"{value} group"
    if key == "mode":
        return f"{value} mount"
    if _number(value):
        return f"{key.replace('_', ' ')} {format_number(value, 6)}"
    return str(value)


_WORDS = {"placement": {"out": "out-of-place", "in": "in-place"}, "stream": {"single": "1 stream"}}
_COUNTED = {"threads": "thread", "streams": "stream", "workers": "worker", "objects": "object"}
_SIZED = {"bs_bytes": "blocks", "part_size_bytes": "parts"}


def axis_label(metric: str) -> str:
    return f"{metric.removesuffix('_gbps')} (GB/s, 1e9 B/s)" if metric.endswith("_gbps") else metric


def plot_records(records: list[tuple[str, dict[str, Any]]], out_path: str, metric: str | None = None,
                 paths: list[str] | None = None) -> tuple[Path, list[str]]:
    """Draw and write the plot; returns its path and a line per row left out (see series).
    A record with nothing to draw (a compose record, a skipped probe, rows without sizes) is
    refused, naming its file, before anything is drawn (it drew an empty picture with a
    library warning)."""
    plt = pyplot(f"the plot {out_path!r}")
    target = check_new_file(out_path, "--out", noun="plot file", claimed=True)
    names = paths or [label for label, _ in records]
    try:
        chosen = pick_metric(records[0][1], metric)
    except UsageError as exc:
        if metric:      # a flag that names no column of the record: the flag's own message
            raise
        raise UsageError(f"{names[0]!r}: {exc}") from None
    notes = []
    for name, (_, record) in zip(names, records, strict=False):
        skipped: list[str] = []
        if not series(record, chosen, skipped):
            raise UsageError(f"{name!r} has no {chosen} per size to plot: {_nothing_because(record, chosen, skipped)}; "
                             f"plot a probe's record, e.g. results/suite-*/nccl.json")
        notes += [f"# left out of the plot: {name} {line}" for line in skipped]
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp.png")
    try:
        # Claimed before drawing: a place we cannot write (read-only, no permission) fails now.
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    except OSError as exc:
        raise UsageError(f"cannot write --out {out_path!r}: {exc.strerror}; pick a writable place, "
                         f"e.g. --out /tmp/{target.name}") from None
    try:
        draw(plt, records, chosen).savefig(tmp)
        os.replace(tmp, target)
    except OSError as exc:
        raise RunError(f"could not write plot file {out_path!r}: {exc.strerror}") from None
    finally:
        plt.close("all")
        if tmp.exists():
            tmp.unlink()
    return target, notes


def _nothing_because(record: dict[str, Any], metric: str, skipped: list[str]) -> str:
    kind = record.get("kind", "?")
    if registry.for_record(record) is None:
        return f"it is a {kind!r} record, not a probe's measurement per size"
    if record.get("status") == "skipped":
        return f"the probe was skipped ({record.get('status_reason') or 'no reason recorded'})"
    if skipped:
        return f"every row with it was left out, e.g. {skipped[0]}"
    return f"no row of this {kind!r} record carries {metric} and a size"


def draw(plt: Any, records: list[tuple[str, dict[str, Any]]], chosen: str, *, figsize: tuple[float, float] = (8, 5),
         title: str | None = None) -> Any:
    """One figure, every record's curves overlaid; the caller saves and closes it. The value
    axis starts at zero: a 6 % drop is drawn as 6 %, not as a cliff (and says so where a
    negative value makes zero not the bottom)."""
    fig, ax = plt.subplots(figsize=figsize, dpi=120)
    lowest = 0.0
    for label, record in records:
        for name, points in series(record, chosen).items():
            xs, ys = zip(*points, strict=False)
            lowest = min(lowest, *ys)
            ax.plot(xs, ys, marker="o", markersize=3, label=f"{label}: {name}" if len(records) > 1 else name)
    ax.set_xscale("log", base=2)
    ticks = sorted({x for _, r in records for pts in series(r, chosen).values() for x, _ in pts})
    ax.set_xticks(ticks[:: max(1, len(ticks) // 10)])
    ax.set_xticklabels([format_size(t) for t in ticks[:: max(1, len(ticks) // 10)]])
    ax.set_xlabel("size (bytes, binary units)")
    ax.set_ylim(bottom=lowest if lowest < 0 else 0)
    ax.set_ylabel(axis_label(chosen) + ("" if lowest >= 0 else ", below zero"))
    kinds = sorted({r.get("kind", "?") for _, r in records})
    ax.set_title(title or f"microbench {', '.join(kinds)}: {chosen.removesuffix('_gbps')} vs size")
    ax.grid(True, which="both", alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def draw_bars(plt: Any, bars: list[tuple[str, float, float | None]], unit: str, *, title: str,
              unknown: str | None = None, figsize: tuple[float, float] = (5.6, 3.0)) -> Any:
    """A probe measured at one size: one horizontal bar per (label, value, expected), the axis
    from zero, each bar's expected value as a dashed mark on it; `unknown` says why there is
    none where no bar has one."""
    fig, ax = plt.subplots(figsize=(figsize[0], max(figsize[1], 0.9 + 0.42 * len(bars))), dpi=120)
    labels = [label for label, _, _ in bars]
    ax.barh(range(len(bars)), [value for _, value, _ in bars], color="#2f6f9f", height=0.6)
    marked = False
    for index, (_, value, expected) in enumerate(bars):
        ax.text(value, index, f" {format_number(value)}", va="center", fontsize=8)
        if expected:
            ax.plot([expected, expected], [index - 0.42, index + 0.42], color="#b06a00", linestyle="--", linewidth=2,
                    label=None if marked else "expected")
            marked = True
    ax.set_yticks(range(len(bars)), labels, fontsize=8)
    ax.invert_yaxis()
    top = max([v for _, v, _ in bars] + [e or 0.0 for _, _, e in bars])
    ax.set_xlim(0, top * 1.25 or 1.0)
    ax.set_xlabel(unit)
    ax.set_title(title, fontsize=10)
    if marked:
        ax.legend(fontsize=8, loc="lower right")
    elif unknown:
        ax.text(0.99, 0.02, f"expected unknown: {unknown}", transform=ax.transAxes, ha="right", va="bottom",
                fontsize=7, color="#5a6470", wrap=True)
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    return fig


def png_bytes(plt: Any, fig: Any) -> bytes:
    import io

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    return buffer.getvalue()


def render_png(records: list[tuple[str, dict[str, Any]]], metric: str | None = None, *,
               figsize: tuple[float, float] = (8, 5), title: str | None = None) -> bytes:
    """The same plot as PNG bytes (for embedding, e.g. in `microbench report`)."""
    import io

    plt = pyplot("the report's plots")
    fig = draw(plt, records, pick_metric(records[0][1], metric), figsize=figsize, title=title)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    return buffer.getvalue()
