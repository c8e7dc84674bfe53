"""`microbench link`: point-to-point TCP bandwidth (one way, both ways) and round-trip latency."""

from __future__ import annotations

import argparse
import os
import socket

from tabulate import tabulate

from ..lab import namespaces as labmod
from ..world.backends import BackendChoice
from ..probes import link as linkprobe
from ..world.policy import in_world
from ..core.units import format_size, parse_list, parse_number, parse_positive_int, parse_sizes
from ..run.runner import run_probe
from ..core.errors import UsageError
from ..expect.formulas import describe as describe_expected
from ..lab.placement import naming_lab_hosts
from ..expect import overrides as expectations
from .common import add_sweep_options, parse_timeout, settings_from_args, write_outputs


DESCRIPTION = ("TCP bandwidth one way (uni) and both ways (bidir) over --streams "
               "connections, and round-trip latency p50/p99 (rtt), between rank 0 and "
               "rank 1: two local processes, two launched ranks, or two lab hosts.")


def add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--lab", default=None, metavar="NAME", help="run between two hosts of this lab (see `microbench lab`)")
    p.add_argument("--pair", default=None, help="with --lab: the two host indices, e.g. 0,1 (default 0,1)")
    p.add_argument("--streams", default="1", help="parallel TCP connections for uni/bidir (default 1)")
    p.add_argument("--sizes", default="1M-64M", help="message sizes for uni/bidir, binary units (default 1M-64M)")
    p.add_argument("--lat-sizes", default="8,512,4K,64K,1M", help="message sizes for rtt (default 8,512,4K,64K,1M)")
    p.add_argument("--factor", default="2", help="step between sizes of a range (default 2)")
    p.add_argument("--ops", default=",".join(linkprobe.OPS), help=f"some of {','.join(linkprobe.OPS)} (default all)")
    p.add_argument("--timeout", default="60", help="seconds without progress before the run fails (default 60)")
    expectations.add_option(p, "one-way bandwidth")
    add_sweep_options(p, warmup=2, iters=10)


def resolve(args: argparse.Namespace) -> linkprobe.Config:
    if args.pair is not None and not args.lab:
        raise UsageError(f"--pair {args.pair!r} needs --lab NAME: it picks two hosts of a lab; without --lab "
                         f"both ends run on this machine (e.g. --lab default --pair 0,1)")
    factor = parse_number(args.factor, what="--factor", example="2", minimum=1.0, allow_minimum=False)
    ops = parse_list(args.ops, linkprobe.OPS, what="--ops")
    streams = parse_positive_int(args.streams, what="--streams", example="4")
    if streams > linkprobe.MAX_STREAMS:
        raise UsageError(f"invalid --streams {args.streams!r}: at most {linkprobe.MAX_STREAMS}, e.g. --streams 4")
    return linkprobe.Config(sizes=parse_sizes(args.sizes, factor=factor),
                            lat_sizes=parse_sizes(args.lat_sizes, factor=factor, what="--lat-sizes"),
                            ops=ops, streams=streams, timeout_s=parse_timeout(args.timeout))


def parse_pair(text: str, hosts: int) -> list[int]:
    try:
        pair = [int(x) for x in str(text).split(",")]
    except ValueError:
        pair = []
    if len(pair) != 2 or pair[0] == pair[1] or not all(0 <= i < hosts for i in pair):
        raise UsageError(f"invalid --pair {text!r}: expected two different host indices below {hosts}, e.g. --pair 0,1")
    return pair


def run(args: argparse.Namespace) -> int:
    config = resolve(args)
    settings = settings_from_args(args, check=False)
    given = expectations.override(args.expected)
    choice = BackendChoice("gloo", "cpu", "tcp", {}, "the link probe exchanges only metadata over gloo")
    per_rank, master_addr = None, "127.0.0.1"
    if args.lab and not os.environ.get("RANK"):
        lab = labmod.get(args.lab)
        _, master_addr, per_rank = labmod.placement(lab, parse_pair(args.pair or "0,1", len(lab.hosts)))

    def body(world) -> int:
        me = os.environ.get("MICROBENCH_LAB_HOST") or socket.gethostname()
        config.hosts = world.all_gather_object(me)
        probe = linkprobe.LinkProbe(config, world)
        lab_name = os.environ.get("MICROBENCH_LAB")
        if lab_name:
            probe.diagnose = lambda: labmod.diagnose(lab_name)
        expect = world.broadcast_object(expectations.for_link(config.hosts, given) if world.rank == 0 else None)
        probe.expected = expect["expected"]
        try:
            with naming_lab_hosts(args.lab, world):
                outcome = run_probe(probe, settings, config=config, world=world, json_path=args.json,
                                    results_dir=args.results_dir, extra_summary=expect)
        finally:
            probe.close()
        if world.rank == 0:
            print_report(outcome.record)
            write_outputs(args, outcome)
            print(f"# results: {outcome.path}")
        return 0

    return in_world(nproc=2, timeout_s=config.timeout_s, choice=choice, body=body, per_rank=per_rank,
                    master_addr=master_addr)


def print_report(record: dict) -> None:
    impl = record["implementation"]
    hosts = impl.get("hosts") or []
    print(f"# microbench link: {' <-> '.join(hosts)}, {impl['streams']} stream(s), implementation {impl['name']} "
          f"({impl['engine']})")
    expected = record["summary"].get("expected")
    known = bool(expected and expected.get("gbps"))
    bw = [(r["op"], format_size(r["size_bytes"]), r["streams"], f"{r['time_us']['p50']:.0f}", f"{r['bw_gbps']:.3f}",
           f"{r['bw_gbit_s']:.2f}", f"{r['total_gbps']:.3f}" if "total_gbps" in r else "-")
          + ((expectations.pct_cell(r["bw_gbps"], expected),) if known else ())
          for r in record["rows"] if r["op"] != "rtt"]
    if bw:
        print(tabulate(bw, headers=["op", "size", "streams", "time p50 (us)", "GB/s", "Gbit/s", "both ways GB/s"]
                       + (["% of expected"] if known else []), tablefmt="simple"))
    lat = [(format_size(r["size_bytes"]), r["rtt_samples"], f"{r['rtt_us_p50']:.1f}", f"{r['rtt_us_p99']:.1f}")
           for r in record["rows"] if r["op"] == "rtt"]
    if lat:
        print()
        print(tabulate(lat, headers=["rtt size", "samples", "p50 (us)", "p99 (us)"], tablefmt="simple"))
    if record["summary"].get("link_gbps"):
        print(f"# link ceiling (one way, largest size): {record['summary']['link_gbps']:.3f} GB/s = "
              f"{record['summary']['link_gbps'] * 8:.2f} Gbit/s")
    if expected:
        # Per direction: bidir's GB/s is each direction's, so it is held against the same line.
        print(f"# {describe_expected(expected)}")
