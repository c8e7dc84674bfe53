"""A lab host's CPU and disk, throttled: one cgroup per throttled host, `mb-<lab>-h<i>`, which
`lab exec` puts the host's command into (the command's children follow it).

`--host-cpu h4=0.3` gives what runs in host 4 a CPU quota of 0.3 CPU (cpu.max 3000 10000), its
threads together; `--host-disk h5=50MB/s` caps its block I/O, read and write, on every disk of
the machine.

A lab host stands for a machine of its own. On a box that runs other work too, a host's
processes get whatever share the scheduler leaves them, and that share moves from one host's
run to the next: with a load average of 9 on 2 cores, every host ran as slowly as one held to
0.6 CPU, and a throttled host was no different from the others; at 8 times the default weight,
unthrottled hosts' matmul rates still differed by 2x from one run to the next. So when any
host's CPU is throttled, every host of the lab gets a cpu cgroup whose weight is 64 times the
default (cpu.shares 65536, cpu.weight 6400): against eight busy processes of the box's other
work a host still gets about 90% of the CPUs, and a throttled host differs from its peers by
its quota, not by the moment it ran.

The controllers are whatever the machine has, found in /proc/mounts: cgroup v1 `cpu`
(cpu.cfs_quota_us, cpu.cfs_period_us) and `blkio` (blkio.throttle.*_bps_device), or the v2
unified hierarchy (cpu.max, io.max) where a v2 mount offers the controller. A v1 hierarchy wins
where both exist: a controller bound to v1 is absent from v2's cgroup.controllers.

cgroup v1 throttles only I/O that the throttled task submits itself: O_DIRECT, reads that miss
the page cache, and the writes its own fsync pushes out. Dirty pages written back later by the
kernel's flusher are not counted (v2's writeback accounting would count them).

Like the namespaces, nothing is kept on disk: the throttles are read back from the cgroups by
their names, and `lab down` removes every cgroup with the lab's exact prefix.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..core.errors import RunError, UsageError
from ..core.units import parse_bandwidth_bytes_per_s, parse_number

PREFIX = "mb-"
# The quota is enforced per period. A 100 ms period (the kernel's default) lets a short piece of
# work run at full speed inside one period's allowance and only then wait, so a 20 ms memcpy
# would time as unthrottled; at 10 ms every iteration spans several periods and reads the quota.
CPU_PERIOD_US = 10_000
MIN_QUOTA_US = 1_000          # the kernel refuses a smaller cpu.cfs_quota_us / cpu.max quota
MOUNTS = "/proc/mounts"
SYS_BLOCK = "/sys/block"
# Block devices that are no disk of the machine: loop files, RAM disks, compressed swap, optical.
_NOT_DISKS = re.compile(r"^(loop|ram|zram|sr|fd|nbd)\d*")
_HOST_RE = re.compile(r"^\s*h(\d+)\s*=\s*(\S+)\s*$")


@dataclass(frozen=True)
class Controller:
    """Where one controller's cgroups live: a v1 hierarchy's mount point, or the v2 mount."""
    name: str          # "cpu" or "io" (blkio in v1)
    version: int       # 1 or 2
    root: Path


WEIGHT_FACTOR = 64    # a lab host's CPU weight against the box's other work, when hosts are throttled
V1_DEFAULT_SHARES, V2_DEFAULT_WEIGHT = 1024, 100


@dataclass
class Throttle:
    cpu_fraction: float | None = None     # CPUs: 0.3 is 30% of one CPU
    disk_bps: int | None = None           # bytes per second, read and write, on every disk
    weighted: bool = False                # in a cpu cgroup of WEIGHT_FACTOR x the default weight

    def describe(self) -> str:
        parts = []
        if self.cpu_fraction is not None:
            parts.append(f"cpu {self.cpu_fraction:g} CPU")
        elif self.weighted:
            parts.append(f"cpu weight {WEIGHT_FACTOR}x")
        if self.disk_bps is not None:
            parts.append(f"disk {self.disk_bps / 1e6:g} MB/s")
        return ", ".join(parts)


# --------------------------------------------------------------------------- parsing (pure)


def _host_values(
    items: list[str], hosts: int, flag: str, example: str, parse: Callable[[str, str], Any]
) -> dict[int, Any]:
    out: dict[int, Any] = {}
    for item in (part for text in items for part in str(text).split(",") if part.strip()):
        match = _HOST_RE.match(item)
        if not match:
            raise UsageError(f"invalid {flag} {item!r}: expected hINDEX=VALUE, e.g. {flag} {example}")
        index = int(match.group(1))
        if not 0 <= index < hosts:
            raise UsageError(f"invalid {flag} {item!r}: the lab has hosts h0 to h{hosts - 1}, e.g. {flag} {example}")
        out[index] = parse(match.group(2), item)
    return out


def parse_host_cpu(items: list[str], hosts: int) -> dict[int, float]:
    """--host-cpu h4=0.3: CPUs (a fraction of one, or more), more than 0 and at most this machine's."""
    cpus = os.cpu_count() or 1

    def fraction(text: str, item: str) -> float:
        try:
            return parse_number(text, what="--host-cpu", example="h4=0.3", minimum=0.0, allow_minimum=False,
                                maximum=float(cpus))
        except UsageError:
            raise UsageError(f"invalid --host-cpu {item!r}: expected CPUs, more than 0 and at most this machine's "
                             f"{cpus}, e.g. --host-cpu h4=0.3 (30% of one CPU)") from None
    return _host_values(items, hosts, "--host-cpu", "h4=0.3", fraction)


def parse_host_disk(items: list[str], hosts: int) -> dict[int, int]:
    """--host-disk h5=50MB/s: a rate with its unit (bytes or bits per second)."""
    def rate(text: str, item: str) -> int:
        try:
            bps = parse_bandwidth_bytes_per_s(text, what="--host-disk")
        except UsageError:
            raise UsageError(f"invalid --host-disk {item!r}: expected a rate with a unit, e.g. --host-disk "
                             f"h5=50MB/s") from None
        if bps < 4096:
            raise UsageError(f"invalid --host-disk {item!r}: below one 4 KiB block per second, no I/O could "
                             f"finish; e.g. --host-disk h5=50MB/s")
        return int(bps)
    return _host_values(items, hosts, "--host-disk", "h5=50MB/s", rate)


def parse_mounts(text: str) -> dict[str, Controller]:
    """The cpu and io controllers from /proc/mounts text (pure): a v1 hierarchy that carries
    the controller (`cpu`, `blkio`; mounted alone or joined, cpu,cpuacct), else the v2 mount
    with the controllers its cgroup.controllers lists (read by the caller: `v2_controllers`)."""
    found: dict[str, Controller] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 4 or fields[2] != "cgroup":
            continue
        options = set(fields[3].split(","))
        for name, v1 in (("cpu", "cpu"), ("io", "blkio")):
            if v1 in options and name not in found:
                found[name] = Controller(name, 1, Path(fields[1]))
    return found


def v2_root(text: str) -> Path | None:
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 3 and fields[2] == "cgroup2":
            return Path(fields[1])
    return None


def cpu_limits(cpus: float) -> tuple[int, int]:
    """(quota_us, period_us) for `cpus` CPUs (pure): a 10 ms period, longer only where the quota
    would fall under the kernel's 1 ms minimum."""
    period = max(CPU_PERIOD_US, math.ceil(MIN_QUOTA_US / cpus))
    return max(MIN_QUOTA_US, round(cpus * period)), period


def cpu_files(version: int, cpus: float | None) -> list[tuple[str, str]]:
    """(file, text) to write, in order (pure): the lab's weight, and the quota when `cpus`."""
    if version == 1:
        out = [("cpu.shares", str(WEIGHT_FACTOR * V1_DEFAULT_SHARES))]
        if cpus is not None:
            quota, period = cpu_limits(cpus)
            out += [("cpu.cfs_period_us", str(period)), ("cpu.cfs_quota_us", str(quota))]
        return out
    out = [("cpu.weight", str(WEIGHT_FACTOR * V2_DEFAULT_WEIGHT))]
    if cpus is not None:
        out.append(("cpu.max", "{} {}".format(*cpu_limits(cpus))))
    return out


def io_files(version: int, devices: list[str], bps: int) -> list[tuple[str, str]]:
    """(file, text) per device (MAJ:MIN), read and write capped alike (pure)."""
    if version == 1:
        return [(f"blkio.throttle.{way}_bps_device", f"{dev} {bps}") for dev in devices for way in ("read", "write")]
    return [("io.max", f"{dev} rbps={bps} wbps={bps}") for dev in devices]


def read_cpu(version: int, files: dict[str, str]) -> float | None:
    """The CPUs back from a cgroup's files (pure); None without a quota."""
    if version == 1:
        quota, period = files.get("cpu.cfs_quota_us", "-1").strip(), files.get("cpu.cfs_period_us", "100000").strip()
    else:
        quota, _, period = files.get("cpu.max", "max 100000").strip().partition(" ")
    if quota in ("-1", "max", "") or not period:
        return None
    return round(int(quota) / int(period), 4)


def read_disk(version: int, files: dict[str, str]) -> int | None:
    """The smallest per-device rate back from a cgroup's files (pure); None without a cap."""
    if version == 1:
        rates = [int(line.split()[1]) for line in files.get("blkio.throttle.write_bps_device", "").splitlines()
                 if len(line.split()) == 2]
    else:
        rates = [int(m) for m in re.findall(r"wbps=(\d+)", files.get("io.max", ""))]
    return min(rates) if rates else None


# --------------------------------------------------------------------------- the system


def controllers() -> dict[str, Controller]:
    """The cpu and io controllers this machine offers, v1 first."""
    try:
        text = Path(MOUNTS).read_text()
    except OSError:
        return {}
    found = parse_mounts(text)
    root = v2_root(text)
    if root is not None:
        try:
            offered = (root / "cgroup.controllers").read_text().split()
        except OSError:
            offered = []
        for name in ("cpu", "io"):
            if name in offered and name not in found:
                found[name] = Controller(name, 2, root)
    return found


def require(host_cpu: dict[int, float], host_disk: dict[int, int]) -> None:
    """Refuse a throttle this machine has no controller for, before anything is created."""
    have = controllers()
    for name, wanted, flag in (("cpu", host_cpu, "--host-cpu"), ("io", host_disk, "--host-disk")):
        if wanted and name not in have:
            what = "cpu (v1) or cpu.max (v2)" if name == "cpu" else "blkio (v1) or io.max (v2)"
            raise RunError(f"{flag} needs a cgroup {name} controller, which this machine does not mount "
                           f"(looked for {what} in {MOUNTS}); drop {flag}, or mount the controller")
    if host_disk and not disks():
        raise RunError(f"--host-disk found no disk to throttle in {SYS_BLOCK}; drop --host-disk")


def disks() -> list[str]:
    """MAJ:MIN of every disk of this machine (whole devices, not partitions)."""
    out = []
    for entry in sorted(Path(SYS_BLOCK).glob("*")) if Path(SYS_BLOCK).is_dir() else []:
        dev = _read(entry / "dev")
        if dev and not _NOT_DISKS.match(entry.name):
            out.append(dev.strip())
    return out


def cgroup_name(lab: str, index: int) -> str:
    return f"{PREFIX}{lab}-h{index}"


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _write(path: Path, text: str) -> None:
    try:
        with open(path, "w") as handle:
            handle.write(text)
    except OSError as exc:
        raise RunError(f"cannot set {path} to {text!r}: {exc.strerror or exc}") from None


def _enable_v2(root: Path, name: str) -> None:
    # A v2 controller acts in a child only once its parent delegates it (cgroup.subtree_control).
    control = root / "cgroup.subtree_control"
    if name not in (_read(control) or "").split():
        _write(control, f"+{name}")


def apply(lab: str, index: int, throttle: Throttle) -> list[str]:
    """Create host `index`'s cgroups with its limits; returns the cgroup directories made."""
    have = controllers()
    made = []
    plans = []
    if throttle.cpu_fraction is not None or throttle.weighted:
        ctl = have["cpu"]
        plans.append((ctl, cpu_files(ctl.version, throttle.cpu_fraction)))
    if throttle.disk_bps is not None:
        ctl = have["io"]
        plans.append((ctl, io_files(ctl.version, disks(), throttle.disk_bps)))
    for ctl, files in plans:
        if ctl.version == 2:
            _enable_v2(ctl.root, ctl.name)
        path = ctl.root / cgroup_name(lab, index)
        try:
            path.mkdir(exist_ok=True)
        except OSError as exc:
            raise RunError(f"cannot create cgroup {path}: {exc.strerror or exc} (cgroups need root)") from None
        made.append(str(path))
        for name, text in files:
            _write(path / name, text)
    return made


def find(lab: str) -> dict[int, tuple[Throttle, list[Path]]]:
    """Every cgroup of lab `lab` now on the system: host index -> (its limits, its directories)."""
    pattern = re.compile(rf"^{re.escape(PREFIX)}{re.escape(lab)}-h(\d+)$")
    out: dict[int, tuple[Throttle, list[Path]]] = {}
    for ctl in controllers().values():
        for path in sorted(ctl.root.glob(f"{PREFIX}{lab}-h*")):
            match = pattern.match(path.name)
            if not match or not path.is_dir():
                continue
            throttle, paths = out.setdefault(int(match.group(1)), (Throttle(), []))
            paths.append(path)
            files = {f.name: _read(f) or "" for f in path.iterdir()
                     if f.name in ("cpu.max", "cpu.cfs_quota_us", "cpu.cfs_period_us", "io.max",
                                   "blkio.throttle.write_bps_device")}
            if ctl.name == "cpu":
                throttle.cpu_fraction, throttle.weighted = read_cpu(ctl.version, files), True
            else:
                throttle.disk_bps = read_disk(ctl.version, files)
    return out


def lab_names() -> set[str]:
    """Names of every lab with a cgroup left on this machine."""
    names = set()
    for ctl in controllers().values():
        for path in ctl.root.glob(f"{PREFIX}*-h*"):
            match = re.match(rf"^{re.escape(PREFIX)}([a-z0-9]{{1,8}})-h\d+$", path.name)
            if match:
                names.add(match.group(1))
    return names


def procs_files(lab: str, index: int) -> list[Path]:
    """The cgroup.procs files a command on host `index` joins (none for an unthrottled host)."""
    return [path / "cgroup.procs" for path in find(lab).get(index, (None, []))[1]]


def remove(lab: str) -> list[str]:
    """Remove every cgroup of the lab; a process still inside goes back to the parent first
    (an rmdir of a cgroup with members fails). Returns what was removed."""
    removed = []
    for _, paths in find(lab).values():
        for path in paths:
            for pid in (_read(path / "cgroup.procs") or "").split():
                try:
                    _write(path.parent / "cgroup.procs", pid)
                except RunError:
                    pass   # it ended meanwhile
            try:
                path.rmdir()
                removed.append(f"cgroup {path}")
            except OSError:
                pass   # named by the caller's leftover check
    return removed


