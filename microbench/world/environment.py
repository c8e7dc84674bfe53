"""The environment block every record carries (`microbench env`)."""

from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from .. import __version__
from ..core.jsonfile import json_object
from ..targets import native
from .fork import FORKED_ENV


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def host_label() -> str:
    """What this host is called where records name hosts (hunt's matrix, a collective's nodes):
    h2 for a rank placed on lab host 2 (its namespace shares the machine's host name), else the
    host name."""
    import re

    match = re.search(r"-(h\d+) \(", os.environ.get("MICROBENCH_LAB_HOST", ""))
    return match.group(1) if match else socket.gethostname()


def cpu_model() -> str:
    text = _read("/proc/cpuinfo") or ""
    for line in text.splitlines():
        if line.lower().startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def memory_bytes() -> dict[str, int]:
    info: dict[str, int] = {}
    for line in (_read("/proc/meminfo") or "").splitlines():
        key, _, rest = line.partition(":")
        if key in ("MemTotal", "MemAvailable"):
            info[key] = int(rest.split()[0]) * 1024
    return {"total_bytes": info.get("MemTotal", 0), "available_bytes": info.get("MemAvailable", 0)}


def nics() -> list[dict[str, Any]]:
    """Network interfaces with speed and link type as sysfs reports them (IB shows under
    /sys/class/infiniband; RoCE NICs show as Ethernet with an infiniband device too)."""
    out = []
    ib_by_netdev: dict[str, str] = {}
    ib_root = Path("/sys/class/infiniband")
    if ib_root.is_dir():
        for dev in sorted(ib_root.iterdir()):
            for port in sorted((dev / "ports").glob("*")):
                for ndev in (port / "gid_attrs" / "ndevs").glob("*") if (port / "gid_attrs" / "ndevs").is_dir() else []:
                    name = _read(str(ndev))
                    if name:
                        ib_by_netdev[name] = dev.name
    net = Path("/sys/class/net")
    for iface in sorted(net.iterdir()) if net.is_dir() else []:
        kind_code = _read(str(iface / "type"))
        speed = _read(str(iface / "speed"))
        try:
            speed_mbps = int(speed) if speed is not None and int(speed) > 0 else None
        except ValueError:
            speed_mbps = None
        link = {"1": "ethernet", "772": "loopback", "32": "infiniband"}.get(kind_code or "", f"type {kind_code}")
        rdma = ib_by_netdev.get(iface.name)
        out.append(
            {
                "name": iface.name,
                "link": link,
                "speed_mbps": speed_mbps,
                "state": _read(str(iface / "operstate")),
                "mtu": int(_read(str(iface / "mtu")) or 0),
                "rdma_device": rdma,
                # What a fleet compares between nodes (a NIC's model and firmware) and where its
                # pair measurements land (the address a peer reached it at). A NIC with a device
                # behind it is hardware; veths, bridges and tunnels come and go with software.
                "physical": (iface / "device").exists(),
                "model": _nic_model(iface),
                "firmware": _read(f"/sys/class/infiniband/{rdma}/fw_ver") if rdma else _ethtool_firmware(iface.name),
                "addresses": [a for a in [_ipv4_address(iface.name)] if a],
            }
        )
    return out


def _nic_model(iface: Path) -> str | None:
    """The NIC's driver and PCI ids ("mlx5_core 15b3:101b"): what lspci would name, without it."""
    try:
        driver = os.path.basename(os.readlink(iface / "device" / "driver"))
    except OSError:
        driver = None
    ids = [(_read(str(iface / "device" / part)) or "").removeprefix("0x") for part in ("vendor", "device")]
    model = " ".join(x for x in (driver, ":".join(ids) if all(ids) else None) if x)
    return model or None


_SIOCETHTOOL, _ETHTOOL_GDRVINFO, _SIOCGIFADDR = 0x8946, 0x3, 0x8915


def _ethtool_firmware(name: str) -> str | None:
    """The firmware version `ethtool -i` prints, asked of the kernel (ETHTOOL_GDRVINFO) directly."""
    import ctypes
    import fcntl
    import struct

    # struct ethtool_drvinfo: cmd, then driver, version, fw_version, bus_info, erom (32 bytes each), ...
    info = ctypes.create_string_buffer(struct.pack("I", _ETHTOOL_GDRVINFO) + bytes(192))
    request = struct.pack("16sP", name.encode()[:15], ctypes.addressof(info)).ljust(40, b"\0")
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            fcntl.ioctl(sock.fileno(), _SIOCETHTOOL, request)
    except OSError:
        return None
    firmware = info.raw[68:100].split(b"\0", 1)[0].decode(errors="replace").strip()
    return firmware if firmware and firmware.lower() not in ("n/a", "na") else None


def _ipv4_address(name: str) -> str | None:
    import fcntl
    import struct

    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            answer = fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
    except OSError:
        return None
    return socket.inet_ntoa(answer[20:24])


def torch_info() -> dict[str, Any]:
    """torch, gloo/NCCL and GPU facts. Importing torch costs ~200 MB of RSS, which would
    distort probes that measure their own memory (S3) and never touch torch: those get the
    facts from a short-lived child process instead."""
    if "torch" in sys.modules:
        return _torch_info_here()
    cached = os.environ.get(TORCH_INFO_ENV)
    if cached:
        try:
            # The hand-off may name its own source (the test session does); the suite's does not.
            return {"torch_info_source": "child process of the suite that launched this step", **json.loads(cached)}
        except ValueError:
            pass  # a damaged hand-off: ask torch ourselves
    return _torch_info_in_child()


# `microbench suite` asks a child process for the torch facts once (~2 s of CPU to import torch)
# and hands them to every step that would otherwise start its own child for the same answer.
TORCH_INFO_ENV = "MICROBENCH_TORCH_INFO"


def torch_info_for_children() -> dict[str, str]:
    return {TORCH_INFO_ENV: json.dumps(_torch_info_in_child())}


def _torch_info_in_child() -> dict[str, Any]:
    code = "import json, microbench.world.environment as e; print(json.dumps(e._torch_info_here()))"
    from .launch import package_env, self_command

    env = package_env()
    try:
        done = subprocess.run(self_command(code), capture_output=True, text=True, timeout=120, env=env)
        if done.returncode == 0:
            return json.loads(done.stdout.strip().splitlines()[-1])
        return {"torch": None, "error": (done.stderr.strip().splitlines() or ["torch probe failed"])[-1][:200]}
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as exc:
        return {"torch": None, "error": f"could not query torch: {exc}"}


def _torch_info_here() -> dict[str, Any]:
    try:
        import torch
        import torch.distributed as dist
    except ImportError as exc:
        return {"torch": None, "error": str(exc)}
    info: dict[str, Any] = {
        "torch": torch.__version__,
        "gloo": dist.is_gloo_available() if dist.is_available() else False,
        "nccl": None,
        "cuda_available": torch.cuda.is_available(),
        "cuda": torch.version.cuda,
        "gpus": [],
    }
    if dist.is_available() and dist.is_nccl_available():
        try:
            info["nccl"] = ".".join(str(v) for v in torch.cuda.nccl.version())
        except Exception as exc:  # a broken NCCL install must not stop `microbench env`
            info["nccl"] = f"unknown ({exc})"
    if torch.cuda.is_available():
        info["gpus"] = gpus()
    return info


def gpus() -> list[dict[str, Any]]:
    """GPUs through NVML (nvidia-ml-py) when present, else what torch knows."""
    try:
        import pynvml

        pynvml.nvmlInit()
        out = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = pynvml.nvmlDeviceGetName(handle)
            mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
            out.append(
                {
                    "index": index,
                    "name": name.decode() if isinstance(name, bytes) else name,
                    "memory_bytes": int(mem.total),
                    "source": "nvml",
                    "driver": pynvml.nvmlSystemGetDriverVersion(),
                }
            )
        return out
    except Exception:
        import torch

        return [
            {
                "index": i,
                "name": torch.cuda.get_device_name(i),
                "memory_bytes": torch.cuda.get_device_properties(i).total_memory,
                "source": "torch",
            }
            for i in range(torch.cuda.device_count())
        ]


def collect(*, with_nics: bool = True) -> dict[str, Any]:
    uname = platform.uname()
    env = {
        "hostname": socket.gethostname(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "memory": memory_bytes(),
        "kernel": uname.release,
        "os": _os_release(),
        "python": platform.python_version(),
        "microbench": __version__,
        "implementation": native.implementation(),
        # A fork of a warm suite process (prefork.py) runs the same code without importing anew.
        "process_start": "fork" if os.environ.get(FORKED_ENV) else "exec",
        **torch_info(),
    }
    if with_nics:
        env["nics"] = nics()
    env["fingerprint"] = fingerprint(env)
    return env


def fingerprint(env: dict[str, Any]) -> dict[str, Any]:
    """What makes nodes alike, from an environment block (a record's, of any age): the fields
    that differ between two nodes of one kind only when something is wrong with one of them.
    `microbench fleet` groups nodes by it and names the field that drifted."""
    gpus = [g for g in env.get("gpus") or [] if isinstance(g, dict)]
    physical = [n for n in env.get("nics") or [] if isinstance(n, dict) and n.get("physical")]
    memory = json_object(env.get("memory"))

    def joined(values: list[Any]) -> str | None:
        shown = sorted({str(v) for v in values if v is not None})
        return ", ".join(shown) if shown else None

    return {
        "gpu_model": joined([g.get("name") for g in gpus]),
        "gpu_count": len(gpus),
        "gpu_driver": joined([g.get("driver") for g in gpus]),
        "cuda": env.get("cuda"),
        "torch": env.get("torch"),
        "nccl": env.get("nccl"),
        "kernel": env.get("kernel"),
        "cpu_model": env.get("cpu_model"),
        "cpu_count": env.get("cpu_count"),
        "memory_bytes": memory.get("total_bytes"),
        "nics": [
            {
                "name": n.get("name"),
                "model": n.get("model"),
                "speed_mbps": n.get("speed_mbps"),
                "firmware": n.get("firmware"),
            }
            for n in physical
        ],
    }


def _os_release() -> str | None:
    for line in (_read("/etc/os-release") or "").splitlines():
        if line.startswith("PRETTY_NAME="):
            return line.split("=", 1)[1].strip('"')
    return None


def format_env(env: dict[str, Any]) -> str:
    from ..core.tables import text_table

    mem = env["memory"]
    rows = [
        ("host", env["hostname"]),
        ("cpu", f"{env['cpu_model']} ({env['cpu_count']} cores, {env['cpu_affinity']} usable)"),
        ("memory", f"{mem['total_bytes'] / 2**30:.1f} GiB total, {mem['available_bytes'] / 2**30:.1f} GiB available"),
        ("kernel", env["kernel"]),
        ("os", env.get("os") or "-"),
        ("python", env["python"]),
        ("torch", env.get("torch") or "not installed"),
        ("gloo", "yes" if env.get("gloo") else "no"),
        ("nccl", env.get("nccl") or "not available (no CUDA build of torch)"),
        ("cuda", env.get("cuda") if env.get("cuda_available") else "no CUDA device"),
        (
            "implementation",
            env["implementation"]["name"]
            + (f" ({env['implementation']['fallback_reason']})" if env["implementation"]["fallback_reason"] else ""),
        ),
    ]
    for gpu in env.get("gpus", []):
        rows.append((f"gpu {gpu['index']}", f"{gpu['name']}, {gpu['memory_bytes'] / 2**30:.0f} GiB ({gpu['source']})"))
    for nic in env.get("nics", []):
        speed = f"{nic['speed_mbps']} Mb/s" if nic["speed_mbps"] else "speed unknown"
        rdma = f", RDMA {nic['rdma_device']}" if nic["rdma_device"] else ""
        rows.append((f"nic {nic['name']}", f"{nic['link']}, {speed}, {nic['state']}, mtu {nic['mtu']}{rdma}"))
    return text_table(rows, tablefmt="plain")
