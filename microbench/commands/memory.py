"""`microbench memory`: host memcpy and GPU copy bandwidth, the ceiling for other probes."""

from __future__ import annotations

import argparse

from tabulate import tabulate

from ..probes import memory as mem
from ..core.units import format_size, parse_sizes
from ..run.runner import run_probe
from .common import add_sweep_options, settings_from_args, write_outputs


def add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sizes", default="64M,256M,1G", help="buffer sizes, well past the caches (default 64M,256M,1G)")
    p.add_argument("--threads", default="0", help="threads for the all-cores case (default: every usable core)")
    add_sweep_options(p, warmup=2, iters=10)


def run(args: argparse.Namespace) -> int:
    from ..core.units import parse_positive_int

    threads = 0 if str(args.threads) == "0" else parse_positive_int(args.threads, what="--threads", example="2")
    settings = settings_from_args(args, check=False)
    config = mem.Config(sizes=parse_sizes(args.sizes), threads=threads,
                        copies_per_call=mem.copies_per_call(settings.warmup, settings.iters))
    probe = mem.MemoryProbe(config)
    outcome = run_probe(probe, settings, config=config, json_path=args.json,
                        results_dir=args.results_dir)
    table = [(r["op"], format_size(r["size_bytes"]), r["threads"] or "-", r.get("copy_kernel") or "-",
              f"{r['time_us']['p50']:.0f}", f"{r['copy_gbps']:.2f}") for r in outcome.rows]
    print(tabulate(table, headers=["op", "size", "threads", "kernel", "time p50 (us)", "copy GB/s"],
                   tablefmt="simple"))
    impl = outcome.record["implementation"]
    if impl["gpu_skipped_reason"]:
        print(f"# GPU copies skipped: {impl['gpu_skipped_reason']}")
    print(f"# implementation {impl['name']}; kernel: the faster here of libc memcpy and streaming (non-temporal) "
          f"stores; results: {outcome.path}")
    write_outputs(args, outcome)
    return 0
