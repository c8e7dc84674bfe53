"""What the rest of the machine took while a measurement ran: the CPU time of every process that
is not ours (this process, the ranks it launched and their children, the helpers it names: an
embedded S3 server, a mount's rclone), read from /proc/stat against our own, plus the time a
hypervisor gave other guests (steal) and the load average at the end.

A timing taken while other work shares the cores is slowed by an amount it cannot see in itself;
the share of the machine others took bounds how far either side of a comparison can have been
slowed (verify/noise.py). Linux only; elsewhere nothing is known and every field says so."""

from __future__ import annotations

import os
import resource
import time
from dataclasses import dataclass
from typing import Any, Iterable

TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class Reading:
    wall_s: float
    capacity: int  # jiffies the CPUs had (every field of /proc/stat's cpu line)
    busy: int  # of which spent running anything, steal included
    steal: int
    ours: float  # jiffies spent by this process tree and its helpers


def _cpu_line() -> tuple[int, int, int] | None:
    try:
        with open("/proc/stat") as handle:
            fields = handle.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    values = [int(v) for v in fields[1:]]
    # user nice system idle iowait irq softirq steal guest guest_nice: guest time is already in user.
    values += [0] * (10 - len(values))
    capacity = sum(values[:8])
    idle = values[3] + values[4]
    return capacity, capacity - idle, values[7]


def _proc_ticks(pid: int) -> tuple[int, int] | None:
    """(parent pid, utime + stime + cutime + cstime) of a live process."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            text = handle.read()
    except OSError:
        return None
    rest = text[text.rfind(")") + 2 :].split()  # the command name may hold spaces and parentheses
    try:
        return int(rest[1]), sum(int(v) for v in rest[11:15])
    except (IndexError, ValueError):
        return None


def _ours(helpers: Iterable[int]) -> float:
    """Jiffies of this process, its reaped children (ranks that ended), every live descendant and
    the helpers, each counted once."""
    me = os.getpid()
    table: dict[int, tuple[int, int]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        names = []
    for name in names:
        if name.isdigit():
            got = _proc_ticks(int(name))
            if got is not None:
                table[int(name)] = got
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    tree, todo = set(), [me, *[p for p in helpers if p]]
    while todo:
        pid = todo.pop()
        if pid in tree:
            continue
        tree.add(pid)
        todo.extend(children.get(pid, []))
    live = sum(table[p][1] for p in tree if p in table and p != me)
    own = resource.getrusage(resource.RUSAGE_SELF)
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    seconds = own.ru_utime + own.ru_stime + reaped.ru_utime + reaped.ru_stime
    return live + seconds * TICKS_PER_S


def read(helpers: Iterable[int] = ()) -> Reading | None:
    cpu = _cpu_line()
    if cpu is None:
        return None
    return Reading(time.monotonic(), cpu[0], cpu[1], cpu[2], _ours(helpers))


def between(start: Reading | None, end: Reading | None) -> dict[str, Any]:
    """What others took between two readings: in CPUs (cores' worth) and as a share of the machine."""
    cpus = os.cpu_count() or 1
    out: dict[str, Any] = {"cpus": cpus, "loadavg_1m": _loadavg()}
    if start is None or end is None or end.capacity <= start.capacity:
        return {
            **out,
            "other_share": None,
            "other_cpus": None,
            "steal_share": None,
            "why": "no /proc/stat here: the load during the run is unknown",
        }
    capacity = end.capacity - start.capacity
    other = max(0.0, (end.busy - start.busy) - (end.ours - start.ours))
    share = min(1.0, other / capacity)
    return {
        **out,
        "wall_s": end.wall_s - start.wall_s,
        "other_share": share,
        "other_cpus": share * cpus,
        "steal_share": (end.steal - start.steal) / capacity,
    }


def _loadavg() -> float | None:
    try:
        with open("/proc/loadavg") as handle:
            return float(handle.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
