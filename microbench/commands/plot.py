"""`microbench plot`: bandwidth-vs-size PNG from one or more saved records."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..accept.plots import plot_records
from ..results import load_record


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plot", help="plot bandwidth vs size from saved records (overlaid) to a PNG")
    p.add_argument("records", nargs="+", metavar="RECORD", help="result JSON files; LABEL=PATH to name a curve")
    p.add_argument(
        "--metric",
        default=None,
        help="column to plot (default: the primary metric of the record's probe, e.g. busbw_gbps for nccl)",
    )
    p.add_argument("--out", default=None, help="PNG path (default: next to the first record, .png)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    loaded, paths = [], []
    for item in args.records:
        label, sep, path = item.partition("=")
        if not sep:
            label, path = Path(item).stem, item
        loaded.append((label, load_record(path)))
        paths.append(path)
    first = args.records[0].partition("=")[2] or args.records[0]
    out = args.out or str(Path(first).with_suffix(".png"))
    target, notes = plot_records(loaded, out, args.metric, paths=paths)
    for line in notes:
        print(line)
    print(f"# plot: {target}")
    return 0
