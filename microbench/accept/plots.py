"""Bandwidth-vs-size curves from saved records, overlaid: where a picture beats a table
(1gbit vs unlimited, IB vs TCP, NVMe vs S3). matplotlib is a main dependency; without it a
plot fails (exit 1), see core/pyplot.py."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..core import registry
from ..core.errors import RunError, UsageError
from ..core.pyplot import pyplot
from ..results.outputs import check_new_file
from ..core.units import format_size


def _number(value: Any) -> bool:
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
            raise UsageError(f"invalid --metric {metric!r}: this record has {', '.join(choices) or 'no metric columns'}")
        return metric
    if not choices:
        if record.get("status") == "skipped":
            raise UsageError(f"the {record.get('kind', '?')!r} record has nothing to plot: the probe was skipped "
                             f"({record.get('status_reason') or 'no reason recorded'})")
        raise UsageError(f"the {record.get('kind', '?')!r} record has no metric columns to plot")
    return choices[0]


def series(record: dict[str, Any], metric: str) -> dict[str, list[tuple[int, float]]]:
    """One (size, value) line per op and per value of the probe's case keys that split rows of
    one op and size (placement in/out, tool posix/fio), sizes ascending."""
    defaults = registry.case_defaults(record)
    rows = [{**defaults, **r} for r in record.get("rows", []) if _number(r.get(metric)) and "size_bytes" in r]
    groups: dict[tuple[str, Any], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault((str(row.get("op")), row["size_bytes"]), []).append(row)
    split = [k for k in registry.case_keys(record)
             if any(len({repr(r.get(k)) for r in group}) > 1 for group in groups.values())]
    out: dict[str, list[tuple[int, float]]] = {}
    for row in rows:
        variant = " ".join(str(row[k]) for k in split if row.get(k) is not None and row.get(k) != row.get("op"))
        name = f"{row.get('op', '?')}{(' ' + variant) if variant else ''}"
        out.setdefault(name, []).append((int(row["size_bytes"]), float(row[metric])))
    return {k: sorted(v) for k, v in out.items()}


def axis_label(metric: str) -> str:
    return f"{metric.removesuffix('_gbps')} (GB/s, 1e9 B/s)" if metric.endswith("_gbps") else metric


def plot_records(records: list[tuple[str, dict[str, Any]]], out_path: str, metric: str | None = None) -> Path:
    plt = pyplot(f"the plot {out_path!r}")
    target = check_new_file(out_path, "--out", noun="plot file", claimed=True)
    chosen = pick_metric(records[0][1], metric)
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
    return target


def draw(plt: Any, records: list[tuple[str, dict[str, Any]]], chosen: str, *, figsize: tuple[float, float] = (8, 5),
         title: str | None = None) -> Any:
    """One figure, every record's curves overlaid; the caller saves and closes it."""
    fig, ax = plt.subplots(figsize=figsize, dpi=120)
    for label, record in records:
        for name, points in series(record, chosen).items():
            xs, ys = zip(*points)
            ax.plot(xs, ys, marker="o", markersize=3, label=f"{label}: {name}" if len(records) > 1 else name)
    ax.set_xscale("log", base=2)
    ticks = sorted({x for _, r in records for pts in series(r, chosen).values() for x, _ in pts})
    ax.set_xticks(ticks[:: max(1, len(ticks) // 10)])
    ax.set_xticklabels([format_size(t) for t in ticks[:: max(1, len(ticks) // 10)]])
    ax.set_xlabel("size (bytes, binary units)")
    ax.set_ylabel(axis_label(chosen))
    kinds = sorted({r.get("kind", "?") for _, r in records})
    ax.set_title(title or f"microbench {', '.join(kinds)}: {chosen.removesuffix('_gbps')} vs size")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


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
