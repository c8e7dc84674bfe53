"""`microbench hunt`: measure every host pair in rounds, name the slow host or the slow link.

The command parses and checks its flags into lab.hunt.HuntOptions; lab/hunt_pairs.py measures,
writes the record and prints the matrix and the verdict (lab/hunt.py: schedule and verdict).
"""

from __future__ import annotations

import argparse

from ..core.errors import UsageError
from ..core.units import parse_bandwidth_bytes_per_s, parse_number, parse_positive_int, parse_size
from ..lab import hunt, hunt_pairs
from ..lab.hunt import HuntOptions
from ..results.outputs import check_new_file
from .common import parse_timeout


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "hunt",
        help="find the slow host or link: every host pair in parallel rounds, a matrix, a verdict",
        description="Measure TCP bandwidth between every pair of hosts, both ways, in N-1 rounds "
        "of disjoint pairs run in parallel; print the host x host matrix and name the "
        "hosts slow with every peer and the single slow links between healthy hosts.",
    )
    p.add_argument(
        "--lab", default=None, metavar="NAME", help="one rank on each host of this lab (see `microbench lab`)"
    )
    p.add_argument("--size", default="8M", help="bytes per transfer, binary units (default 8M)")
    p.add_argument("--iters", default="3", help="timed transfers per direction; the best counts (default 3)")
    p.add_argument("--warmup", default="1", help="untimed transfers per direction first (default 1)")
    p.add_argument("--slow", default="0.7", help="slow = below this fraction of the median bandwidth (default 0.7)")
    p.add_argument(
        "--floor", default=None, metavar="RATE", help="also slow below this absolute rate, e.g. 10GB/s or 100Gbit"
    )
    p.add_argument("--timeout", default="60", help="seconds without progress before the run fails (default 60)")
    p.add_argument("--bisect", action="store_true", help="first an all_reduce over each half of the hosts at once, "
                   "into the slow half (4+ hosts): one bad host in about log2(N) rounds, then pairs confirm it")
    p.add_argument("--heatmap", default=None, metavar="PATH", help="heatmap PNG (default: next to the record, .png)")
    p.add_argument("--json", metavar="PATH", help="write the record here (default: results/hunt-TIME.json)")
    p.add_argument("--csv", metavar="PATH", help="also write one CSV row per directed measurement")
    p.add_argument("--results-dir", default="results", metavar="DIR", help="where records go without --json")
    p.set_defaults(handler=run)


def options(args: argparse.Namespace) -> HuntOptions:
    slow = parse_number(args.slow, what="--slow", example="0.7", minimum=0.0, maximum=1.0, allow_minimum=False)
    floor = parse_bandwidth_bytes_per_s(args.floor, what="--floor") / 1e9 if args.floor else None
    warmup = parse_number(args.warmup, what="--warmup", example="1", minimum=0)
    if warmup != int(warmup):
        raise UsageError(f"invalid --warmup {args.warmup!r}: expected a whole number >= 0, e.g. --warmup 1")
    # Refused here, before the ranks start, rather than by rank 0 after everyone has joined.
    for flag, value in (("--heatmap", args.heatmap), ("--json", args.json), ("--csv", args.csv)):
        if value:
            check_new_file(value, flag, parents_made=flag == "--json")
    hunt.check_default_heatmap(args.json, args.heatmap)
    return HuntOptions(size_bytes=parse_size(args.size, what="--size"),
                       iters=parse_positive_int(args.iters, what="--iters", example="3"), warmup=int(warmup),
                       slow_ratio=slow, floor_gbps=floor, timeout_s=parse_timeout(args.timeout), lab=args.lab,
                       bisect=bool(args.bisect), heatmap=args.heatmap, json=args.json, csv=args.csv,
                       results_dir=args.results_dir)


def run(args: argparse.Namespace) -> int:
    return hunt_pairs.run(options(args))
