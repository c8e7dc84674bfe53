"""Accelerators the composer knows by name: datasheet peak dense bf16 FLOP/s, memory size and
bandwidth, and the host link an async checkpoint stages through. Peaks are vendors' dense
(no 2:4 sparsity) figures; achieved rates are the peak times --mfu, or a measured record."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ..core.errors import UsageError

# A share of device memory the training state cannot use: CUDA context, NCCL buffers,
# allocator fragmentation. 10% is the usual margin seen in practice on 80 GB parts.
RESERVED_MEMORY_FRACTION = 0.10


@dataclass(frozen=True)
class Gpu:
    name: str
    peak_bf16_tflops: float
    memory_bytes: float
    memory_gbps: float          # device memory bandwidth, GB/s
    host_link_gbps: float       # one direction, GB/s (PCIe spec rate)
    source: str
    # The usual node of this GPU, assumed when a job of whole nodes names no network (said so):
    # a collective's busbw among its 8 GPUs, and its NICs together to the other nodes.
    node_intra_gbps: float | None = None
    node_inter_gbps: float | None = None
    node_source: str = ""

    @property
    def usable_memory_bytes(self) -> float:
        return self.memory_bytes * (1 - RESERVED_MEMORY_FRACTION)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


_PCIE4, _PCIE5 = 32.0, 64.0
_HGX_H100 = ("an HGX H100/H200 node: NVLink 4 all_gather busbw 360 GB/s, what NCCL's maintainers expect on H100 "
             "(NVIDIA/nccl-tests#326); eight ConnectX-7 400 Gb/s NICs, 400 GB/s a node (DGX H100/H200 datasheet)")
GPUS: dict[str, Gpu] = {
    g.name: g
    for g in (
        Gpu(
            "h100",
            989.0,
            80e9,
            3350.0,
            _PCIE5,
            "NVIDIA H100 SXM5 datasheet: 989 TFLOPS bf16 dense, 80 GB HBM3, 3.35 TB/s",
            360.0,
            400.0,
            _HGX_H100,
        ),
        Gpu(
            "h200",
            989.0,
            141e9,
            4800.0,
            _PCIE5,
            "NVIDIA H200 SXM datasheet: 989 TFLOPS bf16 dense, 141 GB HBM3e, 4.8 TB/s",
            360.0,
            400.0,
            _HGX_H100,
        ),
        Gpu("a100", 312.0, 80e9, 2039.0, _PCIE4, "NVIDIA A100 SXM4 80GB datasheet: 312 TFLOPS bf16 dense, 2.0 TB/s"),
        Gpu(
            "a100-40gb",
            312.0,
            40e9,
            1555.0,
            _PCIE4,
            "NVIDIA A100 SXM4 40GB datasheet: 312 TFLOPS bf16 dense, 1555 GB/s",
        ),
        Gpu(
            "b200",
            2250.0,
            180e9,
            8000.0,
            _PCIE5,
            "NVIDIA HGX B200 datasheet: 2.25 PFLOPS bf16 dense, 180 GB HBM3e, 8 TB/s",
        ),
        Gpu("l40s", 362.0, 48e9, 864.0, _PCIE4, "NVIDIA L40S datasheet: 362 TFLOPS bf16 dense, 48 GB GDDR6, 864 GB/s"),
        Gpu(
            "mi300x",
            1307.0,
            192e9,
            5300.0,
            _PCIE5,
            "AMD Instinct MI300X datasheet: 1307 TFLOPS bf16 dense, 192 GB HBM3, 5.3 TB/s",
        ),
    )
}


def _key(name: str) -> str:
    return name.strip().lower().replace("-", "").replace("_", "")


def gpu(name: str) -> Gpu:
    found = {_key(g): v for g, v in GPUS.items()}.get(_key(name))
    if found is None:
        raise UsageError(f"unknown --gpu {name!r}: expected one of {', '.join(GPUS)} (e.g. --gpu h100)")
    return found
