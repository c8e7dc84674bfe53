"""Read the facts `expected.py` turns into ceilings: NICs and their rates from sysfs, NVLink and
GPU-NIC nearness through NVML, the lab's shaped rate. Every fact says where it came from, and a
fact that cannot be read says why instead of holding a default."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

SYS_NET = "/sys/class/net"
SYS_IB = "/sys/class/infiniband"
_IB_RATE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*Gb/sec", re.IGNORECASE)


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _pci_path(dev: Path) -> str | None:
    try:
        return os.path.realpath(dev) if dev.exists() else None
    except OSError:
        return None


def ib_ports(root: str = SYS_IB) -> list[dict[str, Any]]:
    """InfiniBand/RoCE ports: device, port, rate, link layer, state, and the netdev behind it."""
    out = []
    base = Path(root)
    for dev in sorted(base.iterdir()) if base.is_dir() else []:
        for port in sorted((dev / "ports").glob("*")):
            rate_text = _read(port / "rate")
            match = _IB_RATE_RE.match(rate_text or "")
            ndevs = port / "gid_attrs" / "ndevs"
            netdev = None
            for nd in sorted(ndevs.glob("*")) if ndevs.is_dir() else []:
                netdev = netdev or _read(nd) or None
            state = (_read(port / "state") or "").split(":")[-1].strip().lower() or None
            out.append({"device": dev.name, "port": port.name,
                        "rate_gbit": float(match.group(1)) if match else None,
                        "rate_source": f"{port / 'rate'}: {rate_text!r}",
                        "link_layer": (_read(port / "link_layer") or "").lower() or None,
                        "state": state, "netdev": netdev, "pci_path": _pci_path(dev / "device")})
    return out


def nics(net_root: str = SYS_NET, ib_root: str = SYS_IB) -> list[dict[str, Any]]:
    """Every network interface with its rate (Gbit/s) or why the rate is unknown."""
    ports = ib_ports(ib_root)
    by_netdev = {p["netdev"]: p for p in ports if p["netdev"]}
    out = []
    base = Path(net_root)
    for iface in sorted(base.iterdir()) if base.is_dir() else []:
        if iface.name == "lo":
            continue
        port = by_netdev.get(iface.name)
        speed_text = _read(iface / "speed")
        rate, why = None, None
        if port and port["rate_gbit"]:
            rate = port["rate_gbit"]
            source = port["rate_source"]
        else:
            source = f"{iface / 'speed'}: {speed_text!r}"
            try:
                mbps = int(speed_text) if speed_text is not None else None
            except ValueError:
                mbps = None
            if mbps and mbps > 0:
                rate = mbps / 1000
            else:
                why = (f"{iface / 'speed'} reads {speed_text!r}" if speed_text is not None
                       else f"{iface / 'speed'} cannot be read (a virtual or down interface)")
        kind = _read(iface / "type")
        out.append({"name": iface.name, "link": "infiniband" if kind == "32" else "ethernet",
                    "rdma": port is not None, "rdma_device": port["device"] if port else None,
                    "state": (_read(iface / "operstate") or "unknown").lower(), "rate_gbit": rate,
                    "rate_source": source, "unknown_why": why, "pci_path": _pci_path(iface / "device")})
    # IB ports without a netdev (plain InfiniBand without IPoIB) are NICs NCCL uses too.
    for p in ports:
        if not p["netdev"]:
            out.append({"name": f"{p['device']}/{p['port']}", "link": p["link_layer"] or "infiniband", "rdma": True,
                        "rdma_device": p["device"], "state": p["state"] or "unknown", "rate_gbit": p["rate_gbit"],
                        "rate_source": p["rate_source"],
                        "unknown_why": None if p["rate_gbit"] else f"{p['rate_source']} is not a rate",
                        "pci_path": p["pci_path"]})
    return out


def default_route_nic(route_file: str = "/proc/net/route") -> str | None:
    try:
        lines = Path(route_file).read_text().splitlines()[1:]
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if len(fields) > 2 and fields[1] == "00000000":
            return fields[0]
    return None


def near(gpu_pci: str | None, nic_pci: str | None) -> bool:
    """Same PCIe switch: the two sysfs device paths share more than the root port."""
    if not gpu_pci or not nic_pci:
        return False
    a, b = gpu_pci.split("/"), nic_pci.split("/")
    common = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        common += 1
    # /sys/devices/pci0000:00/<root port>/<switch upstream>/...: sharing past the root port
    # means one switch above both.
    root = next((i for i, part in enumerate(a) if part.startswith("pci")), None)
    return root is not None and common >= root + 3


# nvmlDeviceGetNvLinkVersion returns NVML's nvmlNvlinkVersion_t, not a generation. Its values,
# as nvidia-ml-py's pynvml.py defines them (_nvmlNvlinkVersion_t): INVALID 0, 1_0 1, 2_0 2,
# 2_2 3, 3_0 4, 3_1 5, 4_0 6, 5_0 7 (6_0 8 in newer nvml.h). The NVLink generation is the major.
NVML_NVLINK_VERSION_NAMES = {0: "NVML_NVLINK_VERSION_INVALID", 1: "NVML_NVLINK_VERSION_1_0",
                             2: "NVML_NVLINK_VERSION_2_0", 3: "NVML_NVLINK_VERSION_2_2",
                             4: "NVML_NVLINK_VERSION_3_0", 5: "NVML_NVLINK_VERSION_3_1",
                             6: "NVML_NVLINK_VERSION_4_0", 7: "NVML_NVLINK_VERSION_5_0",
                             8: "NVML_NVLINK_VERSION_6_0"}
NVLINK_GENERATION_BY_NVML = {1: 1, 2: 2, 3: 2, 4: 3, 5: 3, 6: 4, 7: 5, 8: 6}
# nvmlDeviceGetArchitecture's NVML_DEVICE_ARCH_HOPPER (pynvml.py): Hopper has NVLink 4, yet some
# drivers report NVML_NVLINK_VERSION_5_0 for H100 (vLLM and SGLang carry the same workaround).
NVML_DEVICE_ARCH_HOPPER = 9
HOPPER_NVLINK_GENERATION = 4


def nvlink_generation(raw: int | None, arch: int | None = None) -> tuple[int | None, str]:
    """(NVLink generation, a note naming the NVML value read) from nvmlDeviceGetNvLinkVersion."""
    if raw is None:
        return None, "no NVLink version read"
    name = NVML_NVLINK_VERSION_NAMES.get(raw, "not an NVML_NVLINK_VERSION value microbench knows")
    gen = NVLINK_GENERATION_BY_NVML.get(raw)
    note = f"nvmlDeviceGetNvLinkVersion = {raw} ({name})"
    if gen is not None and arch == NVML_DEVICE_ARCH_HOPPER and gen > HOPPER_NVLINK_GENERATION:
        note += f"; an H100 (NVML_DEVICE_ARCH_HOPPER) has NVLink {HOPPER_NVLINK_GENERATION}, so that is used"
        gen = HOPPER_NVLINK_GENERATION
    return gen, note


def gpus(nic_list: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], str]:
    """GPUs with NVLink generation and active link count, and their near NICs, via NVML."""
    try:
        import pynvml
    except ImportError:
        return [], "unavailable: nvidia-ml-py (pynvml) is not installed"
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVML raises its own error classes; any means "no NVML here"
        return [], f"unavailable: NVML did not initialize ({exc})"
    out = []
    rdma = [n for n in nic_list if n.get("rdma")]
    for index in range(pynvml.nvmlDeviceGetCount()):
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        raw, links, why = None, 0, None
        for link in range(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18)):
            try:
                if pynvml.nvmlDeviceGetNvLinkState(handle, link) == pynvml.NVML_FEATURE_ENABLED:
                    links += 1
                    raw = int(pynvml.nvmlDeviceGetNvLinkVersion(handle, link)) if raw is None else raw
            except Exception as exc:
                why = why or f"NVML: {exc}"
                break
        try:
            arch = int(pynvml.nvmlDeviceGetArchitecture(handle))
        except Exception:  # older drivers lack it; the enum alone decides
            arch = None
        gen, version_note = nvlink_generation(raw, arch)
        bus_id = pynvml.nvmlDeviceGetPciInfo(handle).busId
        bus_id = bus_id.decode() if isinstance(bus_id, bytes) else bus_id
        # NVML writes 8 hex digits of domain; sysfs uses 4.
        short = bus_id.lower()[-12:] if len(bus_id) > 12 else bus_id.lower()
        gpu_pci = _pci_path(Path("/sys/bus/pci/devices") / short)
        near_nics = [n["name"] for n in rdma if near(gpu_pci, n.get("pci_path"))] if gpu_pci else None
        out.append({"index": index, "nvlink_gen": gen, "nvlink_version_nvml": raw, "nvlink_version_note": version_note,
                    "gpu_arch_nvml": arch, "nvlink_links": links,
                    "nvlink_why": None if links else (why or "no NVLink link is enabled"),
                    "pci_bus_id": bus_id, "near_nics": near_nics or None})
    return out, "nvml"


def collect(*, device: str = "cpu") -> dict[str, Any]:
    """This host's facts. NVML is asked only for GPU runs (it is slow to load and meaningless
    on CPU ranks)."""
    nic_list = nics()
    gpu_list, source = gpus(nic_list) if device == "cuda" else ([], "not asked: CPU ranks")
    lab = None
    if os.environ.get("MICROBENCH_LAB"):
        rate = os.environ.get("MICROBENCH_LAB_RATE_BPS", "")
        lab = {"name": os.environ["MICROBENCH_LAB"], "rate_bps": int(rate) if rate.isdigit() else None}
    return {"nics": nic_list, "default_route_nic": default_route_nic(),
            "socket_ifname": os.environ.get("GLOO_SOCKET_IFNAME") or os.environ.get("NCCL_SOCKET_IFNAME"),
            "nccl_socket_ifname": os.environ.get("NCCL_SOCKET_IFNAME"),
            "gpus": gpu_list, "gpu_source": source, "lab": lab}
