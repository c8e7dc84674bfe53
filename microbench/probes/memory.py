"""Memory copy bandwidth: the ceiling storage and network results are stated against.

Host: memcpy from the native core with 1 thread and with every usable core, over sizes well
past the last-level cache. GPU (when CUDA is present): host-to-device and device-to-host from
pinned memory, and device-to-device, through torch. Bandwidth is bytes copied per second
(GB/s = 1e9 B/s); STREAM's "copy" would count the read and the write, twice this.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from ..core.errors import UsageError
from ..core.options import nonneg_int, option, size_range
from ..core.probe import Case, Probe, Timed
from ..core.registry import Needs, ProbeSpec, SuiteStep, SweepDefaults
from ..results.schema import ProbeRow
from ..targets import native

HOST_OPS = ("memcpy_1t", "memcpy_all")
GPU_OPS = ("h2d", "d2h", "d2d")


@dataclass
class Config:
    sizes: list[int] = option([64 << 20, 256 << 20, 1 << 30], parse=size_range, shown="64M,256M,1G",
                              help="buffer sizes, well past the caches")
    threads: int = option(0, parse=nonneg_int, shown="every usable core", help="threads for the all-cores case")
    gpu: bool = True
    # Host copies timed per native call, each call with its own buffers (allocated, touched and
    # checked untimed, which at large sizes costs more than the copies) and kernel choice. The
    # command asks copies_per_call() so a case is one call: a second would pay that setup again.
    copies_per_call: int = 8


def copies_per_call(warmup: int, iters: int) -> int:
    """Native copies per call for a sweep of `warmup` + `iters`: all of them where the sweep is
    short, so a case is one call; a long one still comes in batches, so copies the budget
    leaves unused stay few."""
    return max(1, min(warmup + iters, 32))


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def validate(config: Config) -> Config:
    """Refused before any copy: more threads than usable cores (a copy thread per core is the
    all-cores case; past that they only wait for a CPU, and a hundred thousand cannot even be
    started), and a size whose two buffers the machine's memory cannot hold."""
    from ..core.units import format_size, memory_shortfall
    from ..world.policy import free_memory_bytes

    cores = usable_cores()
    if config.threads > cores:
        raise UsageError(f"invalid --threads {config.threads}: this machine has {cores} usable core(s); use "
                         f"--threads {cores} or fewer, e.g. --threads {cores} (or leave it out: every usable core)")
    largest = max(config.sizes)
    shortfall = memory_shortfall(2 * largest, free_memory_bytes("cpu"), "host memory")
    if shortfall:
        raise UsageError(f"invalid --sizes: a {format_size(largest)} copy reads one buffer and writes another, so it "
                         f"{shortfall}; use smaller --sizes, e.g. --sizes 256M")
    return config


class MemoryRow(ProbeRow):
    threads: int | None             # None for the GPU copies
    copy_kernel: str | None         # the native kernel that won (host copies)
    copy_gbps: float


def gpu_unavailable_reason() -> str | None:
    from ..world.backends import GPU_DEVICE_NODES, TEST_GPU_ENV, gpu_possible

    # Importing torch costs ~2.5 s of CPU (8 s of wall time on a loaded 2-core box); without
    # a GPU device node torch could not see a GPU anyway, so the answer needs no import.
    if not gpu_possible():
        if os.environ.get(TEST_GPU_ENV):
            return f"no CUDA device ({TEST_GPU_ENV}={os.environ[TEST_GPU_ENV]})"
        return f"no CUDA device (none of {', '.join(GPU_DEVICE_NODES)} exists)"
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA device visible to torch"
    return None


class MemoryProbe(Probe):
    name = "memory"

    def __init__(self, config: Config):
        self.config = config
        self.threads_all = config.threads or usable_cores()
        self.gpu_reason = gpu_unavailable_reason() if config.gpu else "GPU cases not requested"
        self._pending: list[float] = []
        # The copy kernel each host case settled on: chosen by the first batch ("auto": the
        # faster on this machine), then kept, so one row never mixes kernels.
        self.kernels: dict[tuple[str, int], str] = {}
        self._tensors: tuple[Any, Any] | None = None

    def implementation(self) -> dict[str, Any]:
        return {"engine": "memcpy (native)" if native.available() else "numpy copy (python fallback)",
                "threads_all": self.threads_all, "gpu": self.gpu_reason is None, "gpu_skipped_reason": self.gpu_reason}

    def cases(self) -> list[Case]:
        ops = list(HOST_OPS) + (list(GPU_OPS) if self.gpu_reason is None else [])
        return [Case(op, size) for op in ops for size in self.config.sizes]

    def row_fields(self, case: Case) -> dict[str, Any]:
        return {"threads": 1 if case.op == "memcpy_1t" else (self.threads_all if case.op == "memcpy_all" else None),
                "copy_kernel": self.kernels.get((case.op, case.size_bytes))}

    def prepare(self, case: Case) -> None:
        self._pending = []
        if case.op in GPU_OPS:
            import torch

            dev = torch.device("cuda")
            n = case.size_bytes
            if case.op == "h2d":
                self._tensors = (
                    torch.empty(n, dtype=torch.uint8, device=dev),
                    torch.ones(n, dtype=torch.uint8).pin_memory(),
                )
            elif case.op == "d2h":
                self._tensors = (
                    torch.empty(n, dtype=torch.uint8).pin_memory(),
                    torch.ones(n, dtype=torch.uint8, device=dev),
                )
            else:
                self._tensors = (
                    torch.empty(n, dtype=torch.uint8, device=dev),
                    torch.ones(n, dtype=torch.uint8, device=dev),
                )

    def run_once(self, case: Case) -> Timed | None:
        if case.op in HOST_OPS:
            # The native loop times each copy itself (no Python inside the timed region); we
            # take its iterations in batches so buffers are allocated and touched once per batch.
            if not self._pending:
                threads = 1 if case.op == "memcpy_1t" else self.threads_all
                key = (case.op, case.size_bytes)
                self._pending, self.kernels[key] = native.memcpy_run(
                    case.size_bytes, threads, self.config.copies_per_call, self.kernels.get(key, "auto")
                )
            return Timed(self._pending.pop(0))
        assert self._tensors is not None
        dst, src = self._tensors
        dst.copy_(src, non_blocking=True)
        return None

    def sync(self) -> None:
        if self._tensors is not None:
            import torch

            torch.cuda.synchronize()

    def timed_on(self, case: Case) -> Any:
        # The GPU copies are enqueued on the current stream (non_blocking); host copies time themselves.
        return "cuda" if case.op in GPU_OPS else None

    def release(self, case: Case) -> None:
        self._tensors = None
        self._pending = []

    def metrics(self, case: Case, time_s: float) -> dict[str, Any]:
        return {"copy_gbps": case.size_bytes / time_s / 1e9}

    def summarize(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        best: dict[str, float] = {}
        for row in rows:
            best[row["op"]] = max(best.get(row["op"], 0.0), row["copy_gbps"])
        return {"peak_copy_gbps": best}


def run(spec: ProbeSpec, config: Config, inv: Any) -> Any:
    """One native call per case where the sweep is short (copies_per_call)."""
    from dataclasses import replace

    from ..run.runner import run_probe

    config = replace(config, copies_per_call=copies_per_call(inv.settings.warmup, inv.settings.iters))
    return run_probe(MemoryProbe(config), inv.settings, config=config, json_path=inv.json_path,
                     results_dir=inv.results_dir)


def print_report(outcome: Any, config: Config) -> None:
    from ..core.tables import text_table
    from ..core.units import format_size

    table = [(r["op"], format_size(r["size_bytes"]), r["threads"] or "-", r.get("copy_kernel") or "-",
              f"{r['time_us']['p50']:.0f}", f"{r['copy_gbps']:.2f}") for r in outcome.rows]
    print(text_table(table, headers=["op", "size", "threads", "kernel", "time p50 (us)", "copy GB/s"],
                   tablefmt="simple"))
    impl = outcome.record["implementation"]
    if impl["gpu_skipped_reason"]:
        print(f"# GPU copies skipped: {impl['gpu_skipped_reason']}")
    print(f"# implementation {impl['name']}; kernel: the faster here of libc memcpy and streaming (non-temporal) "
          f"stores; results: {outcome.path}")


SPEC = ProbeSpec(
    name="memory", command=("memory",), order=10,
    help="host memcpy (1 thread, all cores) and GPU H2D/D2H/D2D copy bandwidth",
    metrics=("copy_gbps",), config=Config, build=lambda config, context=None: MemoryProbe(config),
    row_schema=MemoryRow, validate=validate, run=run, printer=print_report,
    sweep=SweepDefaults(warmup=2, iters=10, check=False), needs=Needs(), aliases=(),
    case_keys=("threads",),
    suite=(SuiteStep("memory", ("--sizes", "256M"), ops=HOST_OPS + GPU_OPS),),
)
