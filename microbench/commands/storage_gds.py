"""`microbench storage gds`: GPUDirect Storage read/write through kvikio (cuFile)."""

from __future__ import annotations

import argparse

from tabulate import tabulate

from ..targets import checkpoint_target as ct
from ..core.errors import ProbeUnavailable, RunError, UsageError
from ..probes.storage import gds
from ..core.units import format_bytes_human, format_size, parse_list, parse_positive_int, parse_size, parse_sizes
from .common import add_sweep_options, settings_from_args, write_outputs
from ..run.runner import run_probe, skip


DESCRIPTION = ("Write and read a file from GPU memory with kvikio's CuFile; the record says "
               "whether real GDS or a compatibility mode served the bytes.")


def add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--path", required=True, help="directory to test; the run writes only inside a unique "
                   "directory it creates there and removes afterwards")
    p.add_argument("--size", default="1G", help="bytes per transfer, e.g. 1G or 256M,1G (default 1G)")
    p.add_argument("--rw", default="write,read", help="write, read or both (default write,read)")
    p.add_argument("--bs", default="16M", help="kvikio task size: bytes per pread/pwrite (default 16M)")
    p.add_argument("--threads", default="4", help="kvikio thread pool size (default 4)")
    p.add_argument("--keep", action="store_true", help="keep the data file")
    p.add_argument("--check", action=argparse.BooleanOptionalAction, default=True,
                   help="compare the bytes written and read with the pattern (default on)")
    add_sweep_options(p, warmup=1, iters=5, budget_s=10.0)


def run(args: argparse.Namespace) -> int:
    sizes = parse_sizes(args.size, what="--size")
    ops = parse_list(args.rw, gds.OPS, what="--rw")
    task = parse_size(args.bs, what="--bs")
    threads = parse_positive_int(args.threads, what="--threads", example="4")
    settings = settings_from_args(args, check=args.check)
    reason = gds.unavailable_reason()
    if reason:  # before the run directory exists
        skip(gds.GdsProbe.name, f"storage gds: {reason}",
             gds.Config(path=args.path, sizes=sizes, ops=ops, task_bytes=task, threads=threads), settings,
             json_path=args.json, results_dir=args.results_dir)
    target = ct.parse_target(args.path)
    if target.kind != "local":
        raise UsageError(f"invalid --path {args.path!r}: GDS needs a local or mounted file system path, e.g. /mnt/nvme")
    run_dir = ct.RunDir(target, ct.unique_name().replace("ckpt", "gds"))
    run_dir.create()
    try:
        ct.check_free_space(run_dir.root, max(sizes) + ct.SPACE_MARGIN_BYTES, f"a {format_bytes_human(max(sizes))} file")
        config = gds.Config(path=run_dir.root, sizes=sizes, ops=ops, task_bytes=task, threads=threads)
        outcome = run_probe(gds.GdsProbe(config), settings, config=config, json_path=args.json,
                            results_dir=args.results_dir)
    finally:
        if not args.keep:
            run_dir.remove()
    impl = outcome.record["implementation"]
    table = [(r["op"], format_size(r["size_bytes"]), r["iters"], f"{r['time_us']['p50'] / 1e3:.1f}",
              f"{r.get('write_gbps', r.get('read_gbps')):.2f}", "N/A" if r["nwrong"] is None else r["nwrong"])
             for r in outcome.rows]
    print(f"# microbench storage gds: {impl['engine']}, served by {impl['served_by']}")
    print(tabulate(table, headers=["op", "size", "iters", "time p50 (ms)", "GB/s", "#wrong"], tablefmt="simple"))
    print(f"# results: {outcome.path}")
    write_outputs(args, outcome)
    wrong = sum(r["nwrong"] or 0 for r in outcome.rows)
    if wrong:
        raise RunError(f"{wrong} wrong byte(s) after GDS transfers (see #wrong)")
    return 0
