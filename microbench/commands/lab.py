"""`microbench lab up|down|status|shape|exec`: emulated hosts (network namespaces) behind shaped
links, each host's CPU and disk throttled on request (cgroups), commands run inside a host."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..core.tables import text_table
from ..core.units import format_link_rate, parse_link_rate
from ..lab import cgroups as labcg, hostexec, namespaces as labmod, parsers as labparse, shaping as labshape


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("lab", help="emulated multi-host network on this machine (namespaces, bridge, tc)",
                       description="Create, inspect and remove a lab: N network namespaces joined by a "
                                   "bridge, each host's egress shaped with tc. Needs root and iproute2.")
    lsub = p.add_subparsers(dest="lab_command", metavar="ACTION", parser_class=type(p))
    lsub.required = True
    up = lsub.add_parser("up", help="create the lab hosts and links")
    up.add_argument("--hosts", required=True, help=f"number of emulated hosts, 2 to {labmod.MAX_HOSTS}")
    up.add_argument("--link", default="1gbit", help="egress rate of each host: 1gbit, 100mbit, 10gbit, "
                    "unlimited (default 1gbit)")
    up.add_argument("--delay", default="0", help="one-way delay added to each host's egress, in ms (default 0)")
    up.add_argument(
        "--name", default=labmod.DEFAULT_NAME, help=f"lab name, 1-8 of a-z0-9 (default {labmod.DEFAULT_NAME})"
    )
    up.add_argument("--ranks-per-host", default="1", help="ranks placed on each host (default 1): they talk over the "
                    "host's own loopback, unshaped (the intra-node network), hosts over the shaped links")
    _add_overrides(up)
    up.add_argument("--host-cpu", action="append", default=[], metavar="hI=FRACTION",
                    help="one host's CPU quota in CPUs, e.g. h4=0.3 (30%% of one CPU; cgroup; repeatable); every "
                         "host then gets a CPU weight 64x the default, ahead of this machine's other work")
    up.add_argument("--host-disk", action="append", default=[], metavar="hI=RATE",
                    help="one host's block I/O, read and write, on every disk, e.g. h5=50MB/s (cgroup; repeatable)")
    shape = lsub.add_parser("shape", help="reshape a running lab: every host, one host, or one link")
    shape.add_argument("--name", default=labmod.DEFAULT_NAME, help=f"lab name (default {labmod.DEFAULT_NAME})")
    shape.add_argument("--link", default=None, help="egress rate of every host (default: the lab's current rate)")
    _add_overrides(shape)
    down = lsub.add_parser("down", help="remove everything a lab created, including leftovers of a crash")
    down.add_argument("--name", default=labmod.DEFAULT_NAME, help=f"lab name (default {labmod.DEFAULT_NAME})")
    down.add_argument("--all", action="store_true", help="remove every microbench lab on this machine")
    ex = lsub.add_parser("exec", help="run a command inside one lab host (its namespace, host name and cgroups)",
                         description="Run COMMAND inside lab host hI: its network namespace, the host name hI, "
                                     "and its cgroups when it is throttled; exit with the command's status.")
    ex.add_argument("--name", default=labmod.DEFAULT_NAME, help=f"lab name (default {labmod.DEFAULT_NAME})")
    ex.add_argument("--host", required=True, metavar="hI", help="the host to run in, e.g. h2")
    ex.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- COMMAND", help="the command and its arguments")
    status = lsub.add_parser("status", help="show hosts, addresses and shaping")
    status.add_argument("--name", default=None, help="only this lab (default: every microbench lab)")
    status.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(handler=run)


def _add_overrides(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host-link", action="append", default=[], metavar="hI=RATE",
                   help="one host's egress at its own rate, e.g. h2=100mbit (repeatable)")
    p.add_argument("--pair-link", action="append", default=[], metavar="hA-hB=RATE",
                   help="only the link between two hosts, both ways, e.g. h0-h1=100mbit (repeatable)")


def run(args: argparse.Namespace) -> int:
    if args.lab_command == "exec":
        return hostexec.run(labmod.check_name(args.name), args.host, list(args.argv))
    if args.lab_command == "shape":
        lab = labmod.get(labmod.check_name(args.name))
        rate = parse_link_rate(args.link) if args.link is not None else lab.rate_bps
        host_rates = labshape.parse_host_links(args.host_link, len(lab.hosts))
        pair_rates = labshape.parse_pair_links(args.pair_link, len(lab.hosts))
        labmod.shape(lab.name, rate, lab.delay_ms, host_rates=host_rates, pair_rates=pair_rates)
        print(f"lab {lab.name!r} reshaped: egress {format_link_rate(rate)}" + _describe(host_rates, pair_rates))
        _print_hosts([labmod.get(lab.name)])
        return 0
    if args.lab_command == "up":
        hosts = labparse.parse_hosts(args.hosts)
        rate = parse_link_rate(args.link)
        delay = labparse.parse_delay(args.delay)
        host_rates = labshape.parse_host_links(args.host_link, hosts)
        pair_rates = labshape.parse_pair_links(args.pair_link, hosts)
        per_host = labparse.parse_ranks_per_host(args.ranks_per_host, hosts)
        host_cpu = labcg.parse_host_cpu(args.host_cpu, hosts)
        host_disk = labcg.parse_host_disk(args.host_disk, hosts)
        lab, created = labmod.up(labmod.check_name(args.name), hosts, rate, delay, host_rates, pair_rates,
                                 ranks_per_host=per_host, host_cpu=host_cpu, host_disk=host_disk)
        ranks = f" x {lab.ranks_per_host} ranks" if lab.ranks_per_host > 1 else ""
        if not created:
            print(f"lab {lab.name!r} is already up with {len(lab.hosts)} hosts{ranks} at {lab.rate}; nothing changed")
            return 0
        print(f"lab {lab.name!r} up: {len(lab.hosts)} hosts{ranks}, egress {lab.rate}"
              f"{f', delay {lab.delay_ms:g} ms' if lab.delay_ms else ''}" + _describe(host_rates, pair_rates)
              + "".join(f"; h{h.index} {_limits(h)}" for h in lab.hosts if _limits(h)))
        _print_hosts([lab])
        return 0
    if args.lab_command == "down":
        names = labmod.lab_names() if args.all else [labmod.check_name(args.name)]
        labmod.require()
        removed = [obj for name in names for obj in labmod.down(name)]
        if not removed:
            print(f"nothing to remove: no {'microbench lab' if args.all else f'lab {args.name!r}'} on this machine")
        else:
            print(f"removed {len(removed)} object(s): {', '.join(removed)}")
        return 0
    labmod.require()
    names = [labmod.check_name(args.name)] if args.name else labmod.lab_names()
    labs = [lab for lab in (labmod.find(n) for n in names) if lab is not None]
    if args.json:
        print(json.dumps([lab.to_dict() for lab in labs], indent=2))
    elif not labs:
        print("no microbench lab is up" if not args.name else labmod.no_lab_message(args.name))
    else:
        _print_hosts(labs)
    return 0


def _print_hosts(labs: list[labmod.Lab]) -> None:
    rows: list[tuple[Any, ...]] = []
    for lab in labs:
        for h in lab.hosts:
            rows.append(
                (
                    lab.name,
                    h.netns,
                    h.address or "-",
                    lab.ranks_per_host,
                    h.ifname,
                    h.state,
                    h.shaping or "none",
                    _limits(h) or "-",
                )
            )
        if lab.bridge is None or len(lab.veths) != len(lab.hosts):
            rows.append(
                (lab.name, "(incomplete)", "-", "-", "-", "-", f"run `microbench lab down --name {lab.name}`", "-")
            )
    print(text_table(rows, headers=["lab", "host (netns)", "address", "ranks", "if", "state", "egress qdisc", "cgroup"],
                     tablefmt="simple"))


def _limits(host: labmod.LabHost) -> str:
    return labcg.Throttle(host.cpu_fraction, host.disk_bps).describe()


def _describe(host_rates: dict, pair_rates: dict) -> str:
    parts = [f"h{i} at {format_link_rate(r)}" for i, r in sorted(host_rates.items())]
    parts += [f"link h{a}-h{b} at {format_link_rate(r)}" for (a, b), r in sorted(pair_rates.items())]
    return f"; except {', '.join(parts)}" if parts else ""
