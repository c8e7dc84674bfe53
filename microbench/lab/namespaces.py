"""The lab: a cluster of emulated hosts on one Linux machine.

Each host is a network namespace `mb-<name>-h<i>` holding one end of a veth pair (`lab0`,
address 10.213.0.<i+1>/24); the other end, `mb-<name>-v<i>`, is a port of the bridge
`mb-<name>-br` in the root namespace. tc shapes each host's egress (tbf, plus netem for a
delay), so every byte a host sends crosses a link of the given rate: a sender is limited by
its own egress and a receiver by the sum of its peers', as with real NICs behind a switch.

Nothing is kept on disk: the lab is read back from the system by its names, so `down` also
removes the leftovers of a run that crashed half way, and no object without the exact
`mb-<name>-` prefix is ever touched. Every lab has its own bridge, so labs never see each other
and may share the same addresses.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from typing import Any

from ..core.errors import RunError, UsageError
from ..core.units import format_link_rate
from . import cgroups as labcg, shaping as labshape

PREFIX = "mb-"
IFNAME = labshape.IFNAME
SUBNET = "10.213.0"
MAX_HOSTS = 64
DEFAULT_NAME = "default"
_NAME_RE = re.compile(r"^[a-z0-9]{1,8}$")


@dataclass
class LabHost:
    index: int
    netns: str
    address: str
    ifname: str = IFNAME
    state: str = "unknown"
    shaping: str = ""
    rate_bps: int | None = None    # this host's egress rate (hosts may differ: --host-link)
    links: list[tuple[str, int | None]] = field(default_factory=list)  # (peer address, rate): --pair-link
    cpu_fraction: float | None = None   # --host-cpu: its cgroup's CPU quota, a share of this machine's CPUs
    disk_bps: int | None = None         # --host-disk: its cgroup's block-I/O cap


@dataclass
class Lab:
    name: str
    hosts: list[LabHost] = field(default_factory=list)
    rate_bps: int | None = None
    delay_ms: float = 0.0
    bridge: str | None = None
    veths: list[str] = field(default_factory=list)
    # Ranks placed on each host (`lab up --ranks-per-host`): they share the host's namespace and
    # talk over its loopback, unshaped, as GPUs of one node do over NVLink.
    ranks_per_host: int = 1
    cgroups: list[str] = field(default_factory=list)   # lab/cgroups.py: one per throttled host

    @property
    def rate(self) -> str:
        return format_link_rate(self.rate_bps)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "rate": self.rate, "rate_bps": self.rate_bps, "delay_ms": self.delay_ms,
                "bridge": self.bridge, "ranks_per_host": self.ranks_per_host, "hosts": [vars(h) for h in self.hosts]}


# --------------------------------------------------------------------------- parsing


def check_name(name: str) -> str:
    if not _NAME_RE.match(str(name)):
        raise UsageError(f"invalid lab --name {name!r}: expected 1-8 lowercase letters or digits "
                         f"(interface names are limited to 15 characters), e.g. --name lab1")
    return name


# The bridge's interface alias keeps the lab's ranks per host: the lab is read back from the
# system by its names (nothing on disk), and an alias lives and dies with the bridge.
_ALIAS_RE = re.compile(r"microbench ranks-per-host=(\d+)")


def _read_ranks_per_host(bridge: str) -> int:
    try:
        with open(f"/sys/class/net/{bridge}/ifalias") as handle:
            found = _ALIAS_RE.search(handle.read())
    except OSError:
        return 1
    return int(found.group(1)) if found else 1


def netns_name(name: str, index: int) -> str:
    return f"{PREFIX}{name}-h{index}"


def host_address(index: int) -> str:
    return f"{SUBNET}.{index + 1}"


# --------------------------------------------------------------------------- system access


def require() -> None:
    """Raise a one-line RunError naming what is missing for the lab (root, iproute2)."""
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        raise RunError(f"the lab needs iproute2 ({' and '.join(missing)} not found on PATH); "
                       f"install it, e.g. apt-get install iproute2")
    if os.geteuid() != 0:
        raise RunError(f"the lab needs root to create network namespaces (running as uid {os.geteuid()}); "
                       f"run as root, e.g. sudo microbench lab up --hosts 2 --link 1gbit")


def _run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(list(cmd), capture_output=True, text=True)
    if check and proc.returncode != 0:
        why = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[0]
        raise RunError(f"`{' '.join(cmd)}` failed: {why}")
    return proc


def _netns_names() -> list[str]:
    out = _run("ip", "netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _root_links() -> list[str]:
    out = _run("ip", "-o", "link", "show", check=False).stdout
    return [line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if ":" in line]


def lab_names() -> list[str]:
    """Names of every lab with anything left on this machine (namespaces or links)."""
    names = set()
    for ns in _netns_names():
        m = re.match(rf"^{PREFIX}([a-z0-9]{{1,8}})-h\d+$", ns)
        if m:
            names.add(m.group(1))
    for link in _root_links():
        m = re.match(rf"^{PREFIX}([a-z0-9]{{1,8}})-(?:br|v\d+)$", link)
        if m:
            names.add(m.group(1))
    return sorted(names | labcg.lab_names())


def find(name: str) -> Lab | None:
    """The lab as the system has it now, or None when nothing of it exists."""
    check_name(name)
    ns_re = re.compile(rf"^{PREFIX}{name}-h(\d+)$")
    lab = Lab(name)
    for ns in _netns_names():
        m = ns_re.match(ns)
        if m:
            lab.hosts.append(_read_host(int(m.group(1)), ns))
    lab.hosts.sort(key=lambda h: h.index)
    links = _root_links()
    lab.bridge = f"{PREFIX}{name}-br" if f"{PREFIX}{name}-br" in links else None
    lab.veths = sorted(link for link in links if re.match(rf"^{PREFIX}{name}-v\d+$", link))
    lab.ranks_per_host = _read_ranks_per_host(lab.bridge) if lab.bridge else 1
    throttles = labcg.find(name)
    lab.cgroups = sorted(str(p) for _, paths in throttles.values() for p in paths)
    for host in lab.hosts:
        throttle = throttles.get(host.index, (labcg.Throttle(), []))[0]
        host.cpu_fraction, host.disk_bps = throttle.cpu_fraction, throttle.disk_bps
    if not lab.hosts and not lab.bridge and not lab.veths and not lab.cgroups:
        return None
    if lab.hosts:
        for host in lab.hosts:
            host.rate_bps = labshape.parse_shaping(host.shaping)[0]
        # The lab's rate is what most hosts have; --host-link exceptions are per host.
        rates = [h.rate_bps for h in lab.hosts]
        lab.rate_bps = max(rates, key=lambda r: (rates.count(r), -rates.index(r)))
        lab.delay_ms = labshape.parse_shaping(lab.hosts[0].shaping)[1]
    return lab


def _read_host(index: int, ns: str) -> LabHost:
    host = LabHost(index, ns, "")
    addr = _run("ip", "-n", ns, "-4", "-o", "addr", "show", "dev", IFNAME, check=False).stdout.split()
    if "inet" in addr:
        host.address = addr[addr.index("inet") + 1].split("/")[0]
    link = _run("ip", "-n", ns, "-o", "link", "show", "dev", IFNAME, check=False).stdout
    m = re.search(r"state (\S+)", link)
    host.state = m.group(1).lower() if m else "missing"
    host.shaping = " ".join(_run("tc", "-n", ns, "qdisc", "show", "dev", IFNAME, check=False).stdout.split())
    if " htb " in f" {host.shaping} ":
        classes = _run("tc", "-n", ns, "class", "show", "dev", IFNAME, check=False).stdout
        host.shaping += " " + " ".join(classes.split())
        filters = _run("tc", "-n", ns, "filter", "show", "dev", IFNAME, check=False).stdout
        host.links = labshape.parse_htb_links(classes, filters)
    return host


# --------------------------------------------------------------------------- up / down / shape


def up(name: str, hosts: int, rate_bps: int | None, delay_ms: float = 0.0,
       host_rates: dict[int, int | None] | None = None,
       pair_rates: dict[tuple[int, int], int | None] | None = None,
       ranks_per_host: int = 1, host_cpu: dict[int, float] | None = None,
       host_disk: dict[int, int] | None = None) -> tuple[Lab, bool]:
    """Create the lab; returns (lab, created). Asking again for the same lab is a no-op
    (created False); a different lab under a taken name is a UsageError, and so is a second
    `up` of one name while the first is still creating it (each would undo the other's links).
    host_cpu and host_disk throttle single hosts through cgroups (lab/cgroups.py)."""
    check_name(name)
    require()
    host_cpu, host_disk = host_cpu or {}, host_disk or {}
    labcg.require(host_cpu, host_disk)
    from ..core.claim import exclusive
    from ..targets.mount.system import state_root

    with exclusive(state_root() / "locks" / f"lab-{name}",
                   f"lab {name!r} is being created by another `microbench lab up --name {name}`; wait for it, "
                   f"then see `microbench lab status --name {name}`, or pick another --name"):
        return _claimed_up(name, hosts, rate_bps, delay_ms, host_rates, pair_rates, ranks_per_host,
                           host_cpu, host_disk)


def _claimed_up(name: str, hosts: int, rate_bps: int | None, delay_ms: float,
                host_rates: dict[int, int | None] | None, pair_rates: dict[tuple[int, int], int | None] | None,
                ranks_per_host: int, host_cpu: dict[int, float], host_disk: dict[int, int]) -> tuple[Lab, bool]:
    existing = find(name)
    if existing is not None and (host_rates or pair_rates or host_cpu or host_disk):
        raise UsageError(f"lab {name!r} already exists; reshape it with `microbench lab shape --name {name} "
                         f"--host-link h2=100mbit`, or remove it first with `microbench lab down --name {name}`")
    if existing is not None:
        same = (len(existing.hosts) == hosts and existing.bridge and len(existing.veths) == hosts
                and existing.rate_bps == rate_bps and abs(existing.delay_ms - delay_ms) < 1e-6
                and existing.ranks_per_host == ranks_per_host)
        if same:
            return existing, False
        raise UsageError(f"lab {name!r} already exists ({len(existing.hosts)} hosts x {existing.ranks_per_host} "
                         f"rank(s), {existing.rate}); "
                         f"remove it first with `microbench lab down --name {name}`")
    bridge = f"{PREFIX}{name}-br"
    try:
        _run("ip", "link", "add", bridge, "type", "bridge")
        _run("ip", "link", "set", bridge, "up")
        if ranks_per_host != 1:
            _run("ip", "link", "set", "dev", bridge, "alias", f"microbench ranks-per-host={ranks_per_host}")
        for i in range(hosts):
            ns, veth = netns_name(name, i), f"{PREFIX}{name}-v{i}"
            proc = _run("ip", "netns", "add", ns, check=False)
            if proc.returncode != 0:
                why = (proc.stderr.strip().splitlines() or ["refused"])[0]
                raise RunError(f"cannot create network namespace {ns}: {why} (namespaces need root with "
                               f"CAP_SYS_ADMIN; in a container, run it privileged)")
            _run("ip", "link", "add", veth, "type", "veth", "peer", "name", IFNAME, "netns", ns)
            _run("ip", "link", "set", veth, "master", bridge)
            _run("ip", "link", "set", veth, "up")
            _run("ip", "-n", ns, "addr", "add", f"{host_address(i)}/24", "dev", IFNAME)
            _run("ip", "-n", ns, "link", "set", IFNAME, "up")
            _run("ip", "-n", ns, "link", "set", "lo", "up")
        shape(name, rate_bps, delay_ms, hosts=hosts, host_rates=host_rates, pair_rates=pair_rates)
        for i in range(hosts) if host_cpu else sorted(host_disk):   # every host weighted alike (cgroups.py)
            labcg.apply(name, i, labcg.Throttle(host_cpu.get(i), host_disk.get(i), weighted=bool(host_cpu)))
    except BaseException:
        down(name)
        raise
    lab = find(name)
    assert lab is not None
    return lab, True


def shape(name: str, rate_bps: int | None, delay_ms: float = 0.0, hosts: int | None = None,
          host_rates: dict[int, int | None] | None = None,
          pair_rates: dict[tuple[int, int], int | None] | None = None) -> None:
    """(Re)shape every host's egress; used by `up`, `lab shape` and --link-profiles between
    sweeps. host_rates override the rate of single hosts, pair_rates of single links."""
    require()
    lab = find(name) if hosts is None else None
    indices = range(hosts) if hosts is not None else [h.index for h in (lab.hosts if lab else [])]
    if hosts is None and not lab:
        raise UsageError(no_lab_message(name))
    plan = labshape.Shaping(rate_bps, dict(host_rates or {}), dict(pair_rates or {}))
    if plan.pairs and delay_ms > 0:
        raise UsageError("--pair-link and --delay cannot be combined: a shaped link uses HTB classes, "
                         "the delay netem; drop one, e.g. --delay 0")
    for i in indices:
        links = plan.links_from(i)
        if links:
            cmds = labshape.htb_commands(netns_name(name, i), plan.host_rate(i),
                                         [(host_address(peer), rate) for peer, rate in links])
        else:
            cmds = labshape.shape_commands(netns_name(name, i), plan.host_rate(i), delay_ms)
        _run(*cmds[0], check=False)  # nothing to delete on a fresh host
        for cmd in cmds[1:]:
            proc = _run(*cmd, check=False)
            if proc.returncode != 0 and "kind is unknown" in proc.stderr:
                kind = "netem" if "netem" in cmd else "tbf"
                raise RunError(f"{'--delay' if kind == 'netem' else '--link'} needs the sch_{kind} kernel module, "
                               f"which this kernel does not have (try `modprobe sch_{kind}`)")
            if proc.returncode != 0:
                _run(*cmd)  # raises with tc's own message


def current_shaping(lab: Lab) -> labshape.Shaping:
    """The lab's shaping as its hosts have it now (base rate, --host-link, --pair-link), to put
    back after something reshapes it for a while (--link-profiles)."""
    by_address = {h.address: h.index for h in lab.hosts}
    links = {h.index: [(by_address[addr], rate) for addr, rate in h.links if addr in by_address] for h in lab.hosts}
    return labshape.current(lab.rate_bps, {h.index: h.rate_bps for h in lab.hosts}, links)


def restore(lab: Lab, plan: labshape.Shaping) -> None:
    """Put back the shaping `current_shaping` read before the lab was reshaped."""
    shape(lab.name, plan.base_bps, lab.delay_ms, host_rates=plan.hosts, pair_rates=plan.pairs)


def down(name: str) -> list[str]:
    """Remove every object of lab `name`, complete or half-made; returns what was removed."""
    check_name(name)
    require()
    removed = []
    for link in _root_links():
        if re.match(rf"^{PREFIX}{name}-v\d+$", link):
            # Deleting one end of a veth pair deletes both.
            if _run("ip", "link", "del", link, check=False).returncode == 0:
                removed.append(link)
    for ns in _netns_names():
        if re.match(rf"^{PREFIX}{name}-h\d+$", ns):
            if _run("ip", "netns", "del", ns, check=False).returncode == 0:
                removed.append(ns)
    bridge = f"{PREFIX}{name}-br"
    if bridge in _root_links() and _run("ip", "link", "del", bridge, check=False).returncode == 0:
        removed.append(bridge)
    removed += labcg.remove(name)
    left = find(name)
    if left is not None:
        raise RunError(f"lab {name!r} could not be removed completely: {describe_leftovers(left)} remain")
    return removed


def describe_leftovers(lab: Lab) -> str:
    return ", ".join([h.netns for h in lab.hosts] + lab.veths + ([lab.bridge] if lab.bridge else []) + lab.cgroups)


def no_lab_message(name: str) -> str:
    return f"no lab named {name!r} is up; create it with `microbench lab up --name {name} --hosts 2 --link 1gbit`"


def get(name: str) -> Lab:
    """The running lab `name`, complete and usable, else a UsageError saying how to make it."""
    require()
    lab = find(check_name(name))
    if lab is None:
        raise UsageError(no_lab_message(name))
    if not lab.bridge or len(lab.veths) != len(lab.hosts) or not all(h.address for h in lab.hosts):
        raise UsageError(f"lab {name!r} is incomplete (a crashed run?); rebuild it with "
                         f"`microbench lab down --name {name}` and `microbench lab up --name {name} ...`")
    return lab


def diagnose(name: str) -> str | None:
    """After a failure: which hosts of the lab have their link down, or None if all are up."""
    try:
        lab = find(name)
    except MicrobenchErrorTypes:
        return None
    if lab is None:
        return f"lab {name!r} is gone (taken down during the run?)"
    down_hosts = [f"{h.netns} ({h.address or 'no address'}, {h.ifname} {h.state})"
                  for h in lab.hosts if h.state not in ("up", "unknown")]
    if not down_hosts:
        return None
    return f"lab host {', '.join(down_hosts)}: link down"


MicrobenchErrorTypes = (RunError, UsageError)
