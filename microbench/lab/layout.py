"""What a lab is, as data (Lab, LabHost), and the names and addresses its objects get on the system:
namespaces `mb-<name>-h<i>`, their interface and 10.213.0.<i+1>; namespaces.py makes, reads back and
removes them."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from ..core.errors import UsageError
from ..core.units import format_link_rate
from . import shaping as labshape

PREFIX = "mb-"
IFNAME = labshape.IFNAME
SUBNET = "10.213.0"
_NAME_RE = re.compile(r"^[a-z0-9]{1,8}$")


@dataclass
class LabHost:
    index: int
    netns: str
    address: str
    ifname: str = IFNAME
    state: str = "unknown"
    shaping: str = ""
    rate_bps: int | None = None  # this host's egress rate (hosts may differ: --host-link)
    links: list[tuple[str, int | None]] = field(default_factory=list)  # (peer address, rate): --pair-link
    cpu_fraction: float | None = None  # --host-cpu: its cgroup's CPU quota, a share of this machine's CPUs
    disk_bps: int | None = None  # --host-disk: its cgroup's block-I/O cap


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
    cgroups: list[str] = field(default_factory=list)  # lab/cgroups.py: one per throttled host

    @property
    def rate(self) -> str:
        return format_link_rate(self.rate_bps)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "rate": self.rate,
            "rate_bps": self.rate_bps,
            "delay_ms": self.delay_ms,
            "bridge": self.bridge,
            "ranks_per_host": self.ranks_per_host,
            "hosts": [vars(h) for h in self.hosts],
        }


def check_name(name: str) -> str:
    if not _NAME_RE.match(str(name)):
        raise UsageError(
            f"invalid lab --name {name!r}: expected 1-8 lowercase letters or digits "
            f"(interface names are limited to 15 characters), e.g. --name lab1"
        )
    return name


def netns_name(name: str, index: int) -> str:
    return f"{PREFIX}{name}-h{index}"


def host_address(index: int) -> str:
    return f"{SUBNET}.{index + 1}"
