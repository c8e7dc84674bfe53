"""`microbench fleet SOURCES...`: cluster acceptance across a fleet. The command parses its flags
into accept.fleet.config.Config, calls accept.fleet.run.run and prints the tables; the exit code
is 1 when a node failed (or a fleet-wide finding stands), 2 on empty or invalid input."""

from __future__ import annotations

import argparse
import sys

from ..accept.fleet import outputs
from ..accept.fleet.config import Config
from ..accept.fleet.run import run as run_fleet
from ..core import options
from ..core.errors import RunError


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "fleet",
        help="cluster acceptance: every node's suite against its peers, the bad ones named",
        description="Gather every node's suite records (directories, globs, s3:// prefixes), group "
        "nodes by fingerprint, hold each node against its peers (robust z with a "
        "false-flag budget, the acceptance floors, the noise of its own runs), attribute "
        "pair results (hunt) to nodes, price each failed node with the composer.",
    )
    p.add_argument(
        "sources",
        nargs="*",
        metavar="SOURCE",
        help="a directory of records (one subdirectory per node, any depth), a glob, or s3://bucket/prefix",
    )
    group = p.add_argument_group("fleet")
    for flag in options.flags(Config):
        shown = "" if flag.default is None else flag.shown()
        group.add_argument(
            flag.flag,
            dest=flag.dest,
            default=None,
            metavar=flag.opt.metavar or flag.name.upper(),
            help=f"{flag.help} (default {shown})" if shown else flag.help,
        )
    p.set_defaults(handler=run)


def config_from(args: argparse.Namespace) -> Config:
    given = {
        flag.name: flag.parse(getattr(args, flag.dest))
        for flag in options.flags(Config)
        if getattr(args, flag.dest) is not None
    }
    return Config(sources=list(args.sources), **given)


def run(args: argparse.Namespace) -> int:
    outcome = run_fleet(config_from(args), sys.argv)
    analysis = outcome.analysis
    for line in outputs.header(analysis):
        print(line)
    print()
    print(outputs.table(analysis))
    print()
    print(outputs.node_table(analysis))
    for line in outputs.closing(analysis):
        print(line)
    print(
        f"# record: {outcome.record}; drain list: {outcome.drain} ({len(analysis.drain)}); rerun list: "
        f"{outcome.rerun} ({len(analysis.rerun)})" + (f"; junit: {outcome.junit}" if outcome.junit else "")
    )
    failed = analysis.failed
    if failed or analysis.findings:
        what = (
            [
                f"{len(failed)} of {len(analysis.nodes)} node(s) not accepted ({', '.join(failed[:8])}"
                f"{', ...' if len(failed) > 8 else ''})"
            ]
            if failed
            else []
        )
        what += [f"{len(analysis.findings)} fleet-wide finding(s)"] if analysis.findings else []
        raise RunError(f"fleet: {'; '.join(what)}; the tables above say why")
    return 0
