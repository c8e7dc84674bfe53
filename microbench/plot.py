"""Bandwidth-vs-size curves from saved records, overlaid: where a picture beats a table
(1gbit vs unlimited, IB vs TCP, NVMe vs S3). matplotlib is an optional extra."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .errors import ProbeUnavailable, RunError, UsageError
from .outputs import check_new_file
from .sizes import format_size


def pick_metric(record: dict[str, Any], metric: str | None) -> str:
    rows = record.get("rows", [])
    keys = [k for row in rows for k, v in row.items() if k.endswith("_gbps") and isinstance(v, (int, float))]
    if metric:
        if metric not in keys:
            raise UsageError(f"invalid --metric {metric!r}: this record has {', '.join(sorted(set(keys))) or 'no *_gbps columns'}")
        return metric
    for preferred in ("busbw_gbps", "write_gbps", "read_gbps", "copy_gbps"):
        if preferred in keys:
            return preferred
    if not keys:
        raise UsageError("the record has no bandwidth (*_gbps) columns to plot")
    return keys[0]


def series(record: dict[str, Any], metric: str) -> dict[str, list[tuple[int, float]]]:
    """One (size, value) line per op and placement/variant, sizes ascending."""
    out: dict[str, list[tuple[int, float]]] = {}
    for row in record.get("rows", []):
        if not isinstance(row.get(metric), (int, float)) or "size_bytes" not in row:
            continue
        variant = row.get("placement") or row.get("rw") or ""
        name = f"{row.get('op', '?')}{(' ' + str(variant)) if variant and variant != row.get('op') else ''}"
        out.setdefault(name, []).append((int(row["size_bytes"]), float(row[metric])))
    return {k: sorted(v) for k, v in out.items()}


def plot_records(records: list[tuple[str, dict[str, Any]]], out_path: str, metric: str | None = None) -> Path:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ProbeUnavailable("plotting needs matplotlib: pip install 'microbench[plot]'") from None
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
    ax.set_ylabel(f"{chosen.removesuffix('_gbps')} (GB/s, 1e9 B/s)")
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

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = draw(plt, records, pick_metric(records[0][1], metric), figsize=figsize, title=title)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    return buffer.getvalue()
