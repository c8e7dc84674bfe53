"""Choosing the collective backend and transport: pure functions, unit-tested on any machine."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..core.errors import ProbeUnavailable, UsageError

BACKENDS = ("auto", "nccl", "gloo")
TRANSPORTS = ("auto", "ib", "tcp")


@dataclass(frozen=True)
class BackendChoice:
    backend: str          # nccl | gloo
    device: str           # cuda | cpu
    transport: str        # what was asked for after resolution: ib | tcp | auto (NCCL decides)
    env: dict[str, str]   # variables that enforce the transport
    reason: str           # one line: why this backend


# Device nodes a CUDA (or ROCm, or WSL2) GPU needs; without any, torch cannot see a GPU, and
# the launcher can skip importing torch (~3 s, serial before the ranks start).
GPU_DEVICE_NODES = ("/dev/nvidiactl", "/dev/nvidia0", "/proc/driver/nvidia", "/dev/kfd", "/dev/dxg")


def gpu_possible(nodes: tuple[str, ...] = GPU_DEVICE_NODES) -> bool:
    return any(os.path.exists(node) for node in nodes)


def cuda_facts() -> tuple[bool, bool]:
    """(CUDA available, NCCL built into torch); torch is imported only where a GPU may exist."""
    if not gpu_possible():
        return False, False
    import torch
    import torch.distributed as dist

    return torch.cuda.is_available(), dist.is_available() and dist.is_nccl_available()


def choose(requested: str, transport: str = "auto") -> "BackendChoice":
    """select_backend on this machine's facts: CUDA, NCCL in torch, InfiniBand devices."""
    cuda, nccl = cuda_facts()
    return select_backend(requested, transport, cuda_available=cuda, nccl_available=nccl,
                          ib_devices=infiniband_devices())


def infiniband_devices(sys_root: str = "/sys/class/infiniband") -> list[str]:
    root = Path(sys_root)
    return sorted(p.name for p in root.iterdir()) if root.is_dir() else []


def select_backend(requested: str, transport: str, *, cuda_available: bool, nccl_available: bool,
                   ib_devices: list[str]) -> BackendChoice:
    if requested not in BACKENDS:
        raise UsageError(f"invalid --backend {requested!r}: expected one of {', '.join(BACKENDS)} (e.g. --backend gloo)")
    if transport not in TRANSPORTS:
        raise UsageError(f"invalid --transport {transport!r}: expected one of {', '.join(TRANSPORTS)} (e.g. --transport tcp)")
    backend = requested
    if requested == "auto":
        backend = "nccl" if cuda_available and nccl_available else "gloo"
    if backend == "nccl":
        if not cuda_available:
            raise ProbeUnavailable("backend nccl needs a CUDA GPU and none is visible to torch; "
                                   "use --backend gloo for the CPU path")
        if not nccl_available:
            raise ProbeUnavailable("backend nccl is not built into this torch (CPU wheel?); install a CUDA build of torch")
        return _nccl_choice(transport, ib_devices, auto=requested == "auto")
    if transport == "ib":
        raise UsageError("invalid --transport 'ib' with backend gloo: gloo only speaks TCP; "
                         "use --transport tcp, or --backend nccl on GPUs with InfiniBand")
    reason = "no CUDA device, so gloo on CPU" if requested == "auto" else "gloo requested"
    return BackendChoice("gloo", "cpu", "tcp", {}, reason)


def _nccl_choice(transport: str, ib_devices: list[str], *, auto: bool) -> BackendChoice:
    reason = "CUDA and NCCL present" if auto else "nccl requested"
    if transport == "tcp":
        # NCCL_IB_DISABLE forces the socket transport even where IB/RoCE exists.
        return BackendChoice("nccl", "cuda", "tcp", {"NCCL_IB_DISABLE": "1"}, reason)
    if transport == "ib":
        if not ib_devices:
            raise ProbeUnavailable("--transport ib needs an InfiniBand/RoCE device and /sys/class/infiniband "
                                   "lists none; use --transport tcp or auto")
        return BackendChoice("nccl", "cuda", "ib", {"NCCL_IB_DISABLE": "0"}, reason)
    return BackendChoice("nccl", "cuda", "auto", {}, reason)


def nccl_transport_from_log(text: str) -> str | None:
    """What NCCL really used, from its NCCL_DEBUG=INFO log: 'ib', 'tcp', or None if unknown.

    NCCL prints 'NET/IB' / 'Using network IB' for verbs and 'NET/Socket' / 'Using network Socket'
    for TCP; intra-node-only runs print P2P/SHM channels and no network line.
    """
    lowered = text.lower()
    if "using network ib" in lowered or "net/ib :" in lowered or "via net/ib" in lowered:
        return "ib"
    if "using network socket" in lowered or "via net/socket" in lowered or "net/socket :" in lowered:
        return "tcp"
    if "via p2p" in lowered or "via shm" in lowered:
        return "intra-node (p2p/shm)"
    return None
