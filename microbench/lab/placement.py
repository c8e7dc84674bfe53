"""Placing a world probe's ranks on a lab: its ranks per host on each host, failures named by
host, the same sweep under several link profiles (--link-profiles), and the link ceiling a
`link` record gives."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

from ..core.errors import MicrobenchError, RunError, UsageError
from ..core.units import format_link_rate, format_size, parse_link_rate
from ..results.store import load_record
from ..run.invocation import Placement
from ..world.dist import World
from ..world.launch import RankLaunch, package_env, self_command
from . import namespaces as labmod


def place(name: str, *, nproc: int | None = None, pair: list[int] | None = None) -> Placement:
    """The lab's ranks per host on its hosts: the first `nproc` ranks (default all), or one rank
    on each of the two hosts of `pair` (the link probe's --pair: a link is between hosts)."""
    lab = labmod.get(name)
    if pair is not None:
        if len(pair) != 2 or pair[0] == pair[1] or not all(0 <= i < len(lab.hosts) for i in pair):
            raise UsageError(f"invalid --pair {','.join(map(str, pair))!r}: expected two different host indices "
                             f"below {len(lab.hosts)}, e.g. --pair 0,1")
        return Placement(*lab_ranks(lab, list(pair), ranks_per_host=1))
    per_host = lab.ranks_per_host
    total = len(lab.hosts) * per_host
    count = total if nproc is None else nproc
    if per_host == 1 and not 2 <= count <= total:
        raise UsageError(f"invalid --nproc {str(nproc)!r} with --lab {name}: the lab has {len(lab.hosts)} "
                         f"hosts and places one rank per host; use 2 to {len(lab.hosts)}")
    if count % per_host or not 2 <= count <= total:
        raise UsageError(f"invalid --nproc {count} with --lab {name}: the lab places {per_host} ranks on each of "
                         f"its {len(lab.hosts)} hosts, and {count} is not a multiple of {per_host} from 2 to "
                         f"{total}; use e.g. --nproc {total}")
    return Placement(*lab_ranks(lab, list(range(count // per_host))))


def lab_ranks(
    lab: labmod.Lab, hosts: list[int] | None = None, ranks_per_host: int | None = None
) -> tuple[int, str, Any]:
    """(nproc, master_addr, per_rank) placing `ranks_per_host` ranks (default the lab's) on each
    lab host of `hosts` (default all), ranks of a host consecutive: rank r on hosts[r // per_host],
    as torchrun and srun number a node's ranks. Each rank is told its node's local rank and size
    (LOCAL_RANK, LOCAL_WORLD_SIZE, as a launcher on that host would) and, apart, its index among
    all ranks of this machine (MICROBENCH_DEVICE_INDEX: its own GPU on a GPU box)."""
    per_host = ranks_per_host or lab.ranks_per_host
    chosen = [lab.hosts[i] for i in (hosts if hosts is not None else range(len(lab.hosts)))]
    # The ranks' expected ceiling (expected.py): the slowest shaped egress among the chosen hosts
    # bounds a ring and a pair alike (hosts may differ: --host-link).
    rates = [h.rate_bps for h in chosen if h.rate_bps]
    slowest = min(rates) if rates else lab.rate_bps

    def per_rank(rank: int) -> RankLaunch:
        host = chosen[rank // per_host]
        return RankLaunch(prefix=["ip", "netns", "exec", host.netns],
                          env={"GLOO_SOCKET_IFNAME": host.ifname, "NCCL_SOCKET_IFNAME": host.ifname,
                               # NCCL tells hosts apart by a hash of the host name, which namespaces
                               # share: without its own id every lab host would be one node to NCCL,
                               # and its ranks would meet over shared memory instead of the links.
                               "NCCL_HOSTID": host.netns,
                               "LOCAL_RANK": str(rank % per_host), "LOCAL_WORLD_SIZE": str(per_host),
                               "MICROBENCH_DEVICE_INDEX": str(rank),
                               "MICROBENCH_LAB": lab.name, "MICROBENCH_LAB_HOST": f"{host.netns} ({host.address})",
                               "MICROBENCH_LAB_RATE_BPS": str(slowest or "")})

    return len(chosen) * per_host, chosen[0].address, per_rank


def lab_facts() -> dict[str, Any]:
    """What the record says about lab placement (empty off the lab)."""
    if not os.environ.get("MICROBENCH_LAB"):
        return {}
    return {"lab": os.environ["MICROBENCH_LAB"], "lab_host_rank0": os.environ.get("MICROBENCH_LAB_HOST"),
            "socket_ifname": os.environ.get("GLOO_SOCKET_IFNAME")}


@contextlib.contextmanager
def naming_lab_hosts(lab_name: str | None, world: World) -> Iterator[None]:
    """A failed run on a lab names the hosts whose link is down (rank 0 can see every host)."""
    try:
        yield
    except MicrobenchError as exc:
        found = labmod.diagnose(os.environ.get("MICROBENCH_LAB") or lab_name) if lab_name and world.rank == 0 else None
        if not found or found in str(exc):
            raise
        raise type(exc)(f"{exc}; {found}") from None


def _without(argv: list[str], *options: str) -> list[str]:
    out, skip = [], False
    for item in argv:
        if skip:
            skip = False
            continue
        if item in options:
            skip = True
            continue
        if any(item.startswith(opt + "=") for opt in options):
            continue
        out.append(item)
    return out


def run_profiles(spec: Any, config: Any, inv: Any) -> int:
    """Run the same sweep once per egress rate (reshaping the lab in between) and compare."""
    if not config.lab:
        raise UsageError("--link-profiles needs --lab NAME: it reshapes the lab's links between sweeps, "
                         "e.g. --lab default --link-profiles 1gbit,unlimited")
    labels = [p.strip() for p in str(config.link_profiles).split(",") if p.strip()]
    rates = [parse_link_rate(p) for p in labels]
    if len(rates) < 2:
        raise UsageError(f"invalid --link-profiles {config.link_profiles!r}: expected two or more rates to compare, "
                         f"e.g. 1gbit,unlimited")
    lab = labmod.get(config.lab)
    # Read before the first reshape: the lab's own exceptions (--host-link, --pair-link) must
    # come back afterwards, not just its base rate.
    before = labmod.current_shaping(lab)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    base = _without(inv.argv if inv.argv is not None else sys.argv[1:], "--link-profiles", "--json")
    env = package_env()
    records: list[tuple[str, dict]] = []
    try:
        for label, rate in zip(labels, rates, strict=False):
            labmod.shape(lab.name, rate, lab.delay_ms)
            if inv.json_path:
                stem = Path(inv.json_path)
                path = stem.with_name(f"{stem.stem}-{format_link_rate(rate)}{stem.suffix or '.json'}")
            else:
                path = Path(inv.results_dir) / f"{spec.name}-lab-{lab.name}-{format_link_rate(rate)}-{stamp}.json"
                # The results directory is made when missing (an explicit --json's is not): the
                # profile's own run is told --json, whose directory must exist.
                path.parent.mkdir(parents=True, exist_ok=True)
            print(f"# link profile {label}: every host's egress shaped to {format_link_rate(rate)}", flush=True)
            code = subprocess.run([*self_command(), *base, "--json", str(path)], env=env).returncode
            if code != 0:
                return code
            records.append((format_link_rate(rate), load_record(path)))
            print(flush=True)
    finally:
        labmod.restore(lab, before)
    if not records:
        raise RunError("no profile produced a record")
    print(profiles_table(records))
    return 0


def profiles_table(records: list[tuple[str, dict[str, Any]]]) -> str:
    """The same sweep under several link profiles: busbw side by side and last/first ratio."""
    labels = [label for label, _ in records]
    first, last = labels[0], labels[-1]
    lines = [f"# busbw (GB/s) by link profile; ratio = {last} / {first}"]
    head = f"#{'op':>15}{'size':>10}" + "".join(f"{label:>12}" for label in labels) + f"{'ratio':>9}"
    lines.append(head)
    ops = list(dict.fromkeys(r["op"] for _, rec in records for r in rec["rows"]))
    for op in ops:
        sizes = sorted({r["size_bytes"] for _, rec in records for r in rec["rows"] if r["op"] == op})
        for size in sizes:
            values = []
            for _, rec in records:
                rows = [r for r in rec["rows"] if r["op"] == op and r["size_bytes"] == size]
                # Out-of-place where the op has it, as the nccl-tests summary does.
                row = next((r for r in rows if r.get("placement") == "out"), rows[0] if rows else None)
                values.append(row["busbw_gbps"] if row else None)
            cells = "".join(f"{v:>12.3f}" if v is not None else f"{'-':>12}" for v in values)
            ratio = (f"{values[-1] / values[0]:>8.2f}x" if values[0] and values[-1] is not None
                     else f"{'-':>9}")
            lines.append(f" {op:>15}{format_size(size):>10}{cells}{ratio}")
    return "\n".join(lines)
