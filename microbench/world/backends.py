"""Choosing the collective backend and transport: pure functions, unit-tested on any machine."""

from __future__ import annotations

import os
import re
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
# For tests only: "absent" makes this machine look GPU-less to microbench (the CPU paths the CLI
# tests assert run on a GPU host too); "present" takes the GPU-possible branches (torch is
# imported and asked, no prefork) on a machine without device nodes. Unset: the device nodes decide.
TEST_GPU_ENV = "MICROBENCH_TEST_GPU"
TEST_GPU_VALUES = ("absent", "present")


def gpu_possible(nodes: tuple[str, ...] = GPU_DEVICE_NODES) -> bool:
    forced = os.environ.get(TEST_GPU_ENV, "").strip().lower()
    if forced:
        if forced not in TEST_GPU_VALUES:
            raise UsageError(f"invalid {TEST_GPU_ENV}={forced!r}: expected one of {', '.join(TEST_GPU_VALUES)} "
                             f"(a test override, e.g. {TEST_GPU_ENV}=absent), or leave it unset")
        return forced == "present"
    return any(os.path.exists(node) for node in nodes)


def cuda_usable() -> bool:
    """CUDA is possible here (gpu_possible) and torch sees a device: the one test every GPU
    path takes, so MICROBENCH_TEST_GPU=absent hides a real GPU from all of them."""
    if not gpu_possible():
        return False
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


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
        raise UsageError(
            f"invalid --backend {requested!r}: expected one of {', '.join(BACKENDS)} (e.g. --backend gloo)"
        )
    if transport not in TRANSPORTS:
        raise UsageError(
            f"invalid --transport {transport!r}: expected one of {', '.join(TRANSPORTS)} (e.g. --transport tcp)"
        )
    backend = requested
    if requested == "auto":
        backend = "nccl" if cuda_available and nccl_available else "gloo"
    if backend == "nccl":
        if not cuda_available:
            raise ProbeUnavailable("backend nccl needs a CUDA GPU and none is visible to torch; "
                                   "use --backend gloo for the CPU path")
        if not nccl_available:
            raise ProbeUnavailable(
                "backend nccl is not built into this torch (CPU wheel?); install a CUDA build of torch"
            )
        return _nccl_choice(transport, ib_devices, auto=requested == "auto")
    if transport == "ib":
        raise UsageError("invalid --transport 'ib' with backend gloo: gloo only speaks TCP; "
                         "use --transport tcp, or --backend nccl on GPUs with InfiniBand")
    reason = "no CUDA device, so gloo on CPU" if requested == "auto" else "gloo requested"
    return BackendChoice("gloo", "cpu", "tcp", {}, reason)


def _nccl_choice(transport: str, ib_devices: list[str], *, auto: bool) -> BackendChoice:
    reason = "CUDA and NCCL present" if auto else "nccl requested"
    # NCCL_NET names the one network module NCCL may use (src/init.cc reads it into
    # config.netName; src/plugin/net.cc initializes only the plugin of that name, compared with
    # strcasecmp, and fails with "Failed to initialize any NET plugin" when it cannot): the
    # transport asked for is enforced instead of falling back. NCCL_IB_DISABLE alone still lets
    # NCCL pick a net plugin (aws-ofi-nccl's "Libfabric") or, with IB, fall back to sockets.
    if transport == "tcp":
        return BackendChoice("nccl", "cuda", "tcp", {"NCCL_NET": "Socket", "NCCL_IB_DISABLE": "1"}, reason)
    if transport == "ib":
        if not ib_devices:
            raise ProbeUnavailable("--transport ib needs an InfiniBand/RoCE device and /sys/class/infiniband "
                                   "lists none; use --transport tcp or auto")
        return BackendChoice("nccl", "cuda", "ib", {"NCCL_NET": "IB", "NCCL_IB_DISABLE": "0"}, reason)
    return BackendChoice("nccl", "cuda", "auto", {}, reason)


def transport_failure_hint(choice: BackendChoice) -> str | None:
    """What to add to a failed world's message when the transport was enforced."""
    net = choice.env.get("NCCL_NET")
    if choice.backend != "nccl" or not net:
        return None
    if net == "IB":
        return ("--transport ib set NCCL_NET=IB, so NCCL fails instead of falling back to sockets: check that "
                "the IB/RoCE ports are up (ibv_devinfo) and NCCL_IB_HCA, or use --transport auto to let NCCL choose")
    return (f"--transport {choice.transport} set NCCL_NET={net}, so NCCL uses no other network: "
            f"use --transport auto to let NCCL choose")


# NCCL's channel lines (NCCL_DEBUG=INFO, subsystem INIT), one per connection, in NCCL's own format:
#   src/transport/net.cc  "Channel %02d/%d : %d[%d] -> %d[%d] [send] via NET/%s/%d%s%s%s" (%s: the
#                         net module's name: IB, Socket, or a plugin's, e.g. aws-ofi-nccl's Libfabric)
#   src/transport/coll_net.cc "CollNet %02d/%1d : %d [send] via COLLNET/%s/%d%s%s"
#   src/transport/p2p.cc  "... via P2P/direct pointer", "via P2P/CUMEM", "via P2P/IPC", "via P2P/indirect/..."
#   src/transport/shm.cc  "Channel %02d : %d[%d] -> %d[%d] via SHM/direct"
# "Using network %s" (src/init.cc) is printed for every communicator, networked or not, and
# "NET/IB : No device found." (src/transport/net_ib/init.cc) on hosts without usable IB: neither
# says which transport carried data, so neither decides.
_NET_CHANNEL_RE = re.compile(r"via (?:NET|COLLNET)/(.+?)/\d")
_P2P_CHANNEL_RE = re.compile(r"via P2P/")
_SHM_CHANNEL_RE = re.compile(r"via SHM/")
# NCCL's net module names -> what the record calls the transport.
NET_TRANSPORTS = {"ib": "ib", "socket": "tcp"}
INTRA_NODE_P2P = "intra-node (NVLink/P2P)"
INTRA_NODE_SHM = "intra-node (SHM)"


def nccl_transport_from_log(text: str) -> str | None:
    """What NCCL really used, from its NCCL_DEBUG=INFO log, decided by the channel lines: 'ib'
    (NET/IB), 'tcp' (NET/Socket), a net plugin's own name in lower case ('libfabric' for AWS EFA
    through aws-ofi-nccl), 'intra-node (NVLink/P2P)' or 'intra-node (SHM)' when no channel
    crosses a network; None when the log has no channel line (one rank, or no INIT subsystem).
    Channels over two networks read 'ib+tcp' (sorted)."""
    nets = {m.group(1) for m in _NET_CHANNEL_RE.finditer(text)}
    if nets:
        return "+".join(sorted(NET_TRANSPORTS.get(name.lower(), name.lower()) for name in nets))
    if _P2P_CHANNEL_RE.search(text):
        return INTRA_NODE_P2P
    if _SHM_CHANNEL_RE.search(text):
        return INTRA_NODE_SHM
    return None
