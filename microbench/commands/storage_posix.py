"""`microbench storage posix`: file throughput, IOPS and latency through the native engine,
optionally beside fio on the same files (--compare-fio)."""

from __future__ import annotations

import argparse
from typing import Any

from tabulate import tabulate

from ..world import interrupts
from ..core.errors import UsageError
from ..probes.storage import posix as sp
from ..run.runner import RunOutcome, run_probe
from ..core.units import format_size, parse_list, parse_positive_int, parse_size
from ..expect import overrides as expectations
from .common import add_sweep_options, settings_from_args, write_outputs


def add_target_options(p: argparse.ArgumentParser) -> None:
    """The workload flags posix and fio share, so both describe the same I/O."""
    g = p.add_argument_group("workload")
    g.add_argument("--path", default="/tmp", help="directory to test; a unique directory is created under it "
                   "and removed afterwards (default /tmp)")
    g.add_argument("--rw", default="read,write", help="read, write or both (default read,write)")
    g.add_argument("--bs", default="1M,16M", help="block sizes, binary units (default 1M,16M)")
    g.add_argument("--threads", default="1", help="parallel workers, each its own slice of the file (default 1)")
    g.add_argument("--qd", default="4", help="I/Os in flight per worker (io_uring; default 4)")
    g.add_argument("--direct", action=argparse.BooleanOptionalAction, default=None,
                   help="O_DIRECT (--direct) or the page cache (--buffered); default O_DIRECT where the "
                        "filesystem allows it")
    g.add_argument("--buffered", dest="direct", action="store_false", help="same as --no-direct")
    g.add_argument("--size", default="1G", help="test file size (default 1G)")
    g.add_argument("--pattern", default="seq", help="seq or rand (default seq)")
    g.add_argument("--keep", action="store_true", help="keep the test directory and file afterwards")
    expectations.add_option(g, "throughput")
    g.add_argument("--no-space-check", dest="space_check", action="store_false",
                   help="skip the free-space check (for filesystems that misreport free space)")


def config_from_args(args: argparse.Namespace) -> sp.Config:
    bs = []
    for part in str(args.bs).split(","):
        if part.strip():
            bs.append(parse_size(part, what="--bs"))
    if not bs:
        raise UsageError(f"invalid --bs {args.bs!r}: empty; expected block sizes, e.g. --bs 1M,16M")
    pattern = str(args.pattern).strip().lower()
    if pattern not in sp.PATTERNS:
        raise UsageError(f"invalid --pattern {args.pattern!r}: expected seq or rand, e.g. --pattern rand")
    config = sp.Config(path=args.path, rw=parse_list(args.rw, sp.RW, what="--rw"), bs=sorted(set(bs)),
                       threads=parse_positive_int(args.threads, what="--threads", example="2"),
                       qd=parse_positive_int(args.qd, what="--qd", example="4"), direct=args.direct,
                       size=parse_size(args.size, what="--size"), pattern=pattern, keep=args.keep,
                       space_check=args.space_check)
    sp.validate(config)
    return config


DESCRIPTION = ("Read and write one test file with the native engine; fsync is inside the timed "
               "write, cached pages are dropped before reads.")


def add_options(p: argparse.ArgumentParser) -> None:
    add_target_options(p)
    p.add_argument("--compare-fio", action="store_true", help="also run fio on the same file and print the ratio")
    add_sweep_options(p, warmup=1, iters=5, budget_s=2.0)


def run(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    settings = settings_from_args(args, check=False)
    tools: tuple[str, ...] = ("posix",)
    skipped = None
    if args.compare_fio:
        from ..probes.storage.fio_engine import fio_unavailable_reason

        skipped = fio_unavailable_reason()
        tools = ("posix",) if skipped else ("posix", "fio")
    outcome = run_storage(sp.PosixProbe, config, settings, args, tools)
    print_report(outcome, config, tools)
    if skipped:
        print(f"# --compare-fio skipped: {skipped}")
    return 0


def run_storage(probe_cls: Any, config: sp.Config, settings: Any, args: argparse.Namespace,
                tools: tuple[str, ...] | None = None) -> RunOutcome:
    given = expectations.override(getattr(args, "expected", None))
    # SIGTERM unwinds like Ctrl-C (for a library caller too), so the test directory is removed.
    previous = interrupts.take()
    try:
        with sp.Target(config) as target:
            probe = probe_cls(config, target, tools)
            expect = expectations.for_storage(target.workdir.facts(), given)
            outcome = run_probe(probe, settings, config=config, json_path=args.json, results_dir=args.results_dir,
                                extra_summary=expect)
    finally:
        interrupts.restore(previous)
    write_outputs(args, outcome)
    return outcome


def _gbps(row: dict[str, Any]) -> str:
    value = f"{row[row['op'] + '_gbps']:.2f}"
    return value + " (memory!)" if row.get("served_from_memory") else value


def _us(value: Any) -> str:
    return "-" if value is None else f"{value:.0f}"


def print_report(outcome: RunOutcome, config: sp.Config, tools: tuple[str, ...]) -> None:
    impl = outcome.record["implementation"]
    mode = "O_DIRECT" if impl["direct_in_effect"] else "buffered (page cache dropped before reads)"
    print(f"# microbench storage {'/'.join(tools)}: {impl['workdir']} on {impl['filesystem']} ({impl['device']}), "
          f"{mode}, engine {impl['engine']} ({impl['name']}), {config.threads} thread(s) x qd {config.qd}, "
          f"{config.pattern}, file {format_size(config.size)}")
    rows = outcome.rows
    expected = outcome.record["summary"].get("expected")
    known = bool(expected and expected.get("gbps"))
    pct = ["% of expected"] if known else []
    if tools == ("posix", "fio"):
        pairs: dict[tuple[str, int], dict[str, dict[str, Any]]] = {}
        for r in rows:
            pairs.setdefault((r["op"], r["size_bytes"]), {})[r["tool"]] = r
        table = []
        for (op, bs), pair in pairs.items():
            mine, fio = pair.get("posix"), pair.get("fio")
            ratio = (f"{mine[op + '_gbps'] / fio[op + '_gbps']:.2f}x" if mine and fio and fio[op + "_gbps"] else "-")
            table.append((op, format_size(bs), _gbps(mine) if mine else "-", _gbps(fio) if fio else "-", ratio,
                          _us(mine and mine.get("lat_us_p99")), _us(fio and fio.get("lat_us_p99")))
                         + ((expectations.pct_cell(mine and mine[op + "_gbps"], expected),) if known else ()))
        print(tabulate(table, headers=["rw", "bs", "posix GB/s", "fio GB/s", "posix/fio", "posix p99 us",
                                       "fio p99 us"] + pct, tablefmt="simple"))
        # Where the CPU, not the device, is the limit, buffer paging decides the ratio: say so.
        print("# buffers: posix uses transparent-huge-page buffers, fio its default malloc; where the CPU is the "
              "limit (VMs, fast NVMe) that alone moves the ratio (docs/BENCHMARKS.md)")
    else:
        table = [(r["op"], format_size(r["bs_bytes"]), r["tool"], _gbps(r), f"{r.get('iops', 0):.0f}",
                  _us(r.get("lat_us_p50")), _us(r.get("lat_us_p99")), _us(r.get("lat_us_p999")), r["iters"])
                 + ((expectations.pct_cell(r[r["op"] + "_gbps"], expected),) if known else ())
                 for r in rows]
        print(tabulate(table, headers=["rw", "bs", "tool", "GB/s", "IOPS", "p50 us", "p99 us", "p99.9 us", "iters"]
                       + pct, tablefmt="simple"))
    if expected:
        print(f"# {expectations.describe(expected)}")
    if impl.get("direct_note"):
        print(f"# O_DIRECT not in effect: {impl['direct_note']}")
    notes = sorted({r["note"] for r in rows if r.get("note")})
    if notes:
        print(f"# (memory!): {'; '.join(notes)} (memcpy {impl['memory_ceiling_gbps']:.2f} GB/s)")
    if config.keep:
        print(f"# kept {impl['workdir']}")
    print(f"# results: {outcome.path}")
