"""What this hardware should give: expected busbw per collective and world layout, from facts.

Pure functions over a facts dict (read by `hwfacts.collect`, or recorded from another machine
for tests). Nothing is guessed: an input that is not known makes the expectation unknown, with
the reason, and every number used is returned beside the result so the record shows the sum.

The model (ring-based collectives, nccl-tests' busbw definitions):

- busbw is defined so that a ring saturating its slowest link reads as that link's bandwidth.
  Inside a node that is one GPU's NVLink bandwidth (NVSwitch, or full-mesh links all used);
  across nodes every node pushes all the data it sends through its NICs, one ring per NIC, so
  busbw = the sum of the NICs the node's GPUs can use (nccl maintainers' "24 GB/s per 200G
  NIC": 8 NICs -> 192 GB/s), limited by NVLink when that is slower.
- AllToAll across nodes: a rank sends (n-1)/n of S, of which (n-g)/n leaves the node, and all g
  ranks of a node share its NICs: busbw = nic_node * (n-1) / (g * (n-g)).
- Line rate x efficiency. NIC_EFFICIENCY 0.96 is the rule of thumb above (24 GB/s of 25 GB/s
  line rate; headers and transport framing). NVLINK_EFFICIENCY 0.80 is what published nccl-tests
  runs reach on NVSwitch nodes (about 235 of 300 GB/s on DGX A100, 360 of 450 on DGX H100).
  A lab link's expectation is its shaped rate itself (efficiency 1.0): the lab exists to hold
  results against the rate it was given.
"""

from __future__ import annotations

from typing import Any

from ..core.units import format_number

NIC_EFFICIENCY = 0.96
NVLINK_EFFICIENCY = 0.80
LAB_EFFICIENCY = 1.0
# Unidirectional GB/s per NVLink link, by NVLink generation (hwfacts.nvlink_generation maps
# NVML's nvmlDeviceGetNvLinkVersion enum to the generation).
NVLINK_GBPS_PER_LINK = {1: 20.0, 2: 25.0, 3: 25.0, 4: 25.0, 5: 50.0}


def unknown(why: str, **inputs: Any) -> dict[str, Any]:
    return {"gbps": None, "unknown_why": why, "formula": None, "inputs": inputs, "limit": None}


def known(gbps: float, formula: str, limit: str, **inputs: Any) -> dict[str, Any]:
    return {"gbps": gbps, "unknown_why": None, "formula": formula, "inputs": inputs, "limit": limit}


def lab_link(facts: dict[str, Any]) -> dict[str, Any]:
    """One lab host's egress: the shaped rate, or unknown when the lab is unshaped."""
    lab = facts["lab"]
    if not lab.get("rate_bps"):
        return unknown(f"lab {lab['name']!r} is unshaped (veth pairs have no line rate); "
                       f"shape it, e.g. `microbench lab up --link 1gbit`", lab=lab["name"])
    gbps = lab["rate_bps"] / 8 / 1e9 * LAB_EFFICIENCY
    return known(gbps, "lab_rate_bps / 8 / 1e9 * lab_efficiency", "lab link",
                 lab=lab["name"], lab_rate_bps=lab["rate_bps"], lab_efficiency=LAB_EFFICIENCY)


def _nic_gbps(nic: dict[str, Any]) -> float:
    return nic["rate_gbit"] / 8 * NIC_EFFICIENCY


def socket_nic(facts: dict[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
    """The NIC a TCP transport (gloo, NCCL's socket transport, the link probe) uses: the one
    named by GLOO_/NCCL_SOCKET_IFNAME, else the default route's."""
    name = facts.get("socket_ifname") or facts.get("default_route_nic")
    if not name:
        return None, "no socket interface is set and no default route was found (/proc/net/route)"
    nic = next((n for n in facts.get("nics", []) if n["name"] == name), None)
    if nic is None:
        return None, f"the socket interface {name!r} is not in /sys/class/net"
    return nic, None


def _ifname_matches(name: str, spec: str) -> bool:
    """NCCL_SOCKET_IFNAME's rules (NCCL's src/misc/socket.cc, matchIfList): a comma list of
    prefixes, '^' before the list excludes them, '=' before it asks for exact names."""
    spec = spec.strip()
    exclude = spec.startswith("^")
    spec = spec.lstrip("^")
    exact = spec.startswith("=")
    spec = spec.lstrip("=")
    hit = any((name == p if exact else name.startswith(p)) for p in (p.strip() for p in spec.split(",")) if p)
    return hit != exclude


def nccl_socket_nics(facts: dict[str, Any]) -> tuple[list[dict[str, Any]], str]:
    """The interfaces NCCL's socket transport uses, in NCCL's order (src/misc/socket.cc,
    ncclFindInterfaces): NCCL_SOCKET_IFNAME when set; else every 'ib*' (IPoIB) interface; else
    any interface but docker*, lo and virbr*. Only interfaces that are up carry traffic."""
    nics = [n for n in facts.get("nics", []) if "/" not in n["name"] and n.get("state") in ("up", "unknown")]
    given = facts.get("nccl_socket_ifname")
    if given:
        return [n for n in nics if _ifname_matches(n["name"], given)], f"NCCL_SOCKET_IFNAME={given}"
    ipoib = [n for n in nics if n["name"].startswith("ib")]
    if ipoib:
        return ipoib, "NCCL's socket transport prefers ib* (IPoIB) interfaces"
    rest = [n for n in nics if not _ifname_matches(n["name"], "docker,lo,virbr")]
    return rest, "NCCL's socket transport: every interface but docker*, lo and virbr*"


def node_nics(facts: dict[str, Any], device: str, ranks_per_node: int,
              transport: str = "auto") -> tuple[list[dict[str, Any]], str]:
    """The NICs one node's ranks can use between nodes, and how they were chosen. With
    --transport tcp, NCCL runs its socket transport (NCCL_NET=Socket), whatever RDMA NICs exist."""
    if device == "cuda" and transport == "tcp":
        return nccl_socket_nics(facts)
    if device == "cuda":
        rdma = [n for n in facts.get("nics", []) if n.get("rdma") and n.get("state") in ("up", "active")]
        if rdma:
            gpus = facts.get("gpus", [])[:ranks_per_node]
            near = [g.get("near_nics") for g in gpus]
            if gpus and all(n is not None for n in near):
                names = {name for names in near for name in names}
                chosen = [n for n in rdma if n["name"] in names]
                if chosen:
                    return chosen, f"RDMA NICs near the node's {len(gpus)} GPU(s) (PCIe topology)"
            return rdma, "every RDMA NIC that is up (GPU-NIC affinity not known)"
        return nccl_socket_nics(facts)
    nic, _ = socket_nic(facts)
    return ([nic] if nic else []), "the socket interface (TCP transport uses one NIC)"


def nvlink_gbps(facts: dict[str, Any], ranks_per_node: int) -> dict[str, Any]:
    gpus = facts.get("gpus", [])
    if not gpus:
        return unknown(f"no GPU facts ({facts.get('gpu_source') or 'no NVML'}); intra-node ranks on CPUs "
                       f"talk through shared memory or loopback TCP, which have no line rate")
    used = gpus[:ranks_per_node]
    missing = [g for g in used if not g.get("nvlink_links")]
    if missing:
        g = missing[0]
        return unknown(f"GPU {g['index']} has no active NVLink ({g.get('nvlink_why') or 'NVML reports none'}); "
                       f"the PCIe path's ceiling is not derived")
    per_gpu = []
    for g in used:
        per_link = NVLINK_GBPS_PER_LINK.get(g["nvlink_gen"])
        if per_link is None:
            return unknown(f"GPU {g['index']} reports NVLink generation {g['nvlink_gen']!r} "
                           f"({g.get('nvlink_version_note') or 'from NVML'}), whose link rate microbench does not know")
        per_gpu.append(g["nvlink_links"] * per_link)
    slowest = min(per_gpu)
    g0 = used[per_gpu.index(slowest)]
    return known(slowest * NVLINK_EFFICIENCY, "nvlink_links * gbps_per_link * nvlink_efficiency", "nvlink",
                 nvlink_gen=g0["nvlink_gen"], **({"nvlink_version_nvml": g0["nvlink_version_nvml"]}
                                                 if g0.get("nvlink_version_nvml") is not None else {}),
                 nvlink_links=g0["nvlink_links"],
                 gbps_per_link=NVLINK_GBPS_PER_LINK[g0["nvlink_gen"]], nvlink_efficiency=NVLINK_EFFICIENCY)


def inter_node_gbps(facts: dict[str, Any], device: str, ranks_per_node: int, transport: str = "auto") -> dict[str, Any]:
    nics, how = node_nics(facts, device, ranks_per_node, transport)
    if not nics:
        _, why = socket_nic(facts)
        return unknown(f"no NIC found for traffic between nodes: {why}")
    for nic in nics:
        if nic.get("rate_gbit") is None:
            return unknown(f"NIC {nic['name']} reports no speed ({nic.get('unknown_why') or 'unreadable'})",
                           nic=nic["name"])
    total = sum(_nic_gbps(n) for n in nics)
    return known(total, "sum(nic_rate_gbit) / 8 * nic_efficiency", "nics", nics=[n["name"] for n in nics],
                 nic_rate_gbit=[n["rate_gbit"] for n in nics], nic_link=[n["link"] for n in nics],
                 nics_chosen=how, nic_efficiency=NIC_EFFICIENCY)


def expected_busbw(facts: dict[str, Any], op: str, *, nodes: int, ranks_per_node: int,
                   device: str, transport: str = "auto") -> dict[str, Any]:
    """Expected busbw (GB/s) of one collective for `nodes` x `ranks_per_node` ranks over the
    transport asked for (auto, ib or tcp: --transport)."""
    n = nodes * ranks_per_node
    layout = {"nodes": nodes, "ranks_per_node": ranks_per_node, "device": device, "op": op, "transport": transport}
    if n < 2:
        return {**unknown("one rank moves nothing between ranks"), "layout": layout}
    if facts.get("lab"):
        # One rank per lab host: every rank's traffic crosses its host's shaped egress.
        return {**lab_link(facts), "layout": layout}
    if nodes == 1:
        if device != "cuda":
            out = unknown(f"all {n} ranks share one host: CPU ranks exchange through loopback TCP or shared "
                          f"memory, which have no line rate (no NIC is crossed)")
        else:
            out = nvlink_gbps(facts, ranks_per_node)
        return {**out, "layout": layout}
    inter = inter_node_gbps(facts, device, ranks_per_node, transport)
    if inter["gbps"] is not None and op == "all_to_all":
        g = ranks_per_node
        share = (n - 1) / (g * (n - g))
        inter = known(inter["gbps"] * share, f"({inter['formula']}) * (n-1) / (g * (n-g))", "nics",
                      **inter["inputs"], n=n, g=g)
    if ranks_per_node > 1 and device == "cuda" and inter["gbps"] is not None:
        intra = nvlink_gbps(facts, ranks_per_node)
        if intra["gbps"] is not None and intra["gbps"] < inter["gbps"]:
            return {**intra, "layout": layout, "also": inter}
        return {**inter, "layout": layout, "also": intra}
    return {**inter, "layout": layout}


def expected_link(facts: dict[str, Any], *, same_host: bool) -> dict[str, Any]:
    """Expected one-way TCP bandwidth between two hosts (the link probe)."""
    if facts.get("lab"):
        return lab_link(facts)
    if same_host:
        return unknown("both ends run on one host: loopback TCP has no line rate (no NIC is crossed)")
    nic, why = socket_nic(facts)
    if nic is None:
        return unknown(why or "no socket interface")
    if nic.get("rate_gbit") is None:
        return unknown(
            f"NIC {nic['name']} reports no speed ({nic.get('unknown_why') or 'unreadable'})", nic=nic["name"]
        )
    return known(_nic_gbps(nic), "nic_rate_gbit / 8 * nic_efficiency", "nic", nic=nic["name"],
                 nic_rate_gbit=nic["rate_gbit"], nic_link=nic["link"], nic_efficiency=NIC_EFFICIENCY)


def percent(value: float | None, expected: dict[str, Any] | None) -> float | None:
    if value is None or not expected or not expected.get("gbps"):
        return None
    return 100.0 * value / expected["gbps"]


def describe(expected: dict[str, Any]) -> str:
    """One line for under a table: the expectation and its inputs, or unknown and why."""
    if expected.get("gbps") is None:
        return f"(expected: unknown, {expected.get('unknown_why')})"
    inputs = ", ".join(f"{k} {v}" for k, v in expected["inputs"].items())
    return f"expected {format_number(expected['gbps'], 4)} GB/s ({expected['limit']}: {expected['formula']}; {inputs})"


# Filesystems whose bytes cross the network: their ceiling is the NIC's.
NETWORK_FILESYSTEMS = ("nfs", "nfs4", "cifs", "smb3", "lustre", "beegfs", "gpfs", "ceph", "glusterfs", "9p",
                       "fuse.s3fs", "fuse.gcsfuse", "fuse.juicefs", "wekafs")
MEMORY_FILESYSTEMS = ("tmpfs", "ramfs", "hugetlbfs", "devtmpfs")


def _from_socket_nic(facts: dict[str, Any], what: str) -> dict[str, Any]:
    nic, why = socket_nic(facts)
    if nic is None:
        return unknown(f"{what} crosses the network, but {why}")
    if nic.get("rate_gbit") is None:
        return unknown(f"{what} crosses NIC {nic['name']}, which reports no speed "
                       f"({nic.get('unknown_why') or 'unreadable'})", nic=nic["name"])
    return known(_nic_gbps(nic), "nic_rate_gbit / 8 * nic_efficiency", "nic", nic=nic["name"],
                 nic_rate_gbit=nic["rate_gbit"], nic_efficiency=NIC_EFFICIENCY)


def expected_storage(facts: dict[str, Any], *, filesystem: str, device: str) -> dict[str, Any]:
    """Expected file throughput: a network filesystem's NIC; a local disk is unknown (Linux
    publishes no bandwidth for block devices), memory is the memcpy ceiling's business."""
    fs = filesystem.lower()
    if fs in MEMORY_FILESYSTEMS:
        return unknown(f"{fs} is memory, not a device: its ceiling is the memcpy one (see `microbench memory`)")
    if fs in NETWORK_FILESYSTEMS or fs.startswith("nfs"):
        return _from_socket_nic(facts, f"{fs} ({device})")
    if fs.startswith("fuse") and fs != "fuseblk":
        # A FUSE daemon (rclone, gcsfuse ...) decides where the bytes go: its cache on a local
        # disk, a remote over the network, or both, one after the other; no device is read.
        daemon = fs.partition(".")[2] or "its daemon"
        return unknown(f"{device} ({fs}) is a FUSE mount: {daemon} decides where its bytes go (a local cache, a "
                       f"remote over the network, or both), and no device behind it states a bandwidth; give the "
                       f"rate you expect with --expected, e.g. --expected 1GB/s")
    if not device.startswith("/dev/"):
        return unknown(f"{device} ({fs}) is not a block device Linux states a bandwidth for; give the rate you "
                       f"expect with --expected, e.g. --expected 1GB/s")
    return unknown(f"{device} ({fs}) is a local block device, and Linux reports no bandwidth for block devices; "
                   f"give the drive's rated speed with --expected, e.g. --expected 7GB/s")


def expected_s3(facts: dict[str, Any], *, endpoint_host: str | None, embedded: bool) -> dict[str, Any]:
    if embedded or endpoint_host in ("127.0.0.1", "localhost", "::1"):
        return unknown("the S3 server runs on this host: requests cross loopback, which has no line rate")
    return _from_socket_nic(facts, f"the endpoint {endpoint_host or '(AWS default)'}")
