"""GPUDirect Storage: file <-> GPU memory through kvikio (cuFile).

Each case moves `size` bytes between one file and one GPU buffer with kvikio's CuFile
pwrite/pread (split into --bs tasks over kvikio's thread pool); the write includes an fsync.
write_gbps / read_gbps = size / time, 1e9 B/s.

Honesty about the path: kvikio may serve the bytes three ways, and the record says which:
  * kvikio compat mode ON (libcufile missing, /run/udev unreadable, KVIKIO_COMPAT_MODE=ON):
    POSIX I/O through a host bounce buffer, no cuFile at all;
  * cuFile loaded but the driver reports no GDS (no nvidia-fs, unsupported file system):
    cuFile's own compatibility mode, still through host memory;
  * cuFile with GDS available: DMA between the storage and GPU memory.
Before each read the file's pages are dropped (posix_fadvise DONTNEED) so the read sees the
storage, not the page cache (which only the compat paths could use anyway).
"""

from __future__ import annotations

import ctypes
import os
import time
from dataclasses import dataclass, field
from typing import Any

from ...core.errors import ProbeUnavailable, RunError
from ...core.probe import Case, Probe, Timed
from ...core.registry import Needs, ProbeSpec, SuiteStep
from ...results.schema import ProbeRow

OPS = ("write", "read")


@dataclass
class Config:
    path: str                       # the run's own directory (created and removed by the command)
    sizes: list[int] = field(default_factory=lambda: [1 << 30])
    ops: list[str] = field(default_factory=lambda: list(OPS))
    task_bytes: int = 16 << 20      # kvikio task size: one pread/pwrite per task
    threads: int = 4                # kvikio thread pool


def libcuda_present() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
        return True
    except OSError:
        return False


class GdsRow(ProbeRow, total=False):
    write_gbps: float               # by op
    read_gbps: float


def unavailable_reason(import_kvikio: Any = None, cuda_driver: Any = None, device_count: Any = None) -> str | None:
    """One line saying why GDS cannot be measured here, or None. The arguments let tests stand
    in for kvikio, the driver and torch."""
    try:
        (import_kvikio or _import_kvikio)()
    except ImportError:
        return "kvikio is not installed (pip install kvikio-cu12 on a CUDA 12 machine)"
    if not (cuda_driver or libcuda_present)():
        return "no CUDA driver (libcuda.so.1 cannot be loaded)"
    count = (device_count or _cuda_device_count)()
    if count < 1:
        return "no CUDA device visible"
    return None


def _import_kvikio() -> Any:
    import kvikio  # noqa: F401
    import kvikio.defaults  # noqa: F401

    return kvikio


def _cuda_device_count() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except ImportError:
        return 0


def io_path(kvikio: Any) -> dict[str, Any]:
    """Which path serves the bytes, across kvikio APIs (25.x: compat_mode() -> bool/enum;
    26.x: defaults.get('compat_mode') and cufile_driver.properties)."""
    defaults = kvikio.defaults
    try:
        mode = defaults.get("compat_mode") if hasattr(defaults, "get") else defaults.compat_mode()
    except Exception:
        mode = defaults.compat_mode()
    compat = _is_on(mode)
    gds_available: bool | None = None
    reason = None
    if not compat:
        try:
            import kvikio.cufile_driver as driver

            props = getattr(driver, "properties", None)
            if props is None and hasattr(driver, "DriverProperties"):
                props = driver.DriverProperties()
            gds_available = bool(props.is_gds_available) if props is not None else None
        except Exception as exc:  # the driver refused to open: cuFile still serves in its compat mode
            gds_available, reason = False, str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
    if compat:
        served = "kvikio compat mode (POSIX + host bounce buffer, cuFile not used)"
    elif gds_available:
        served = "GPUDirect Storage (cuFile, GDS available)"
    elif gds_available is False:
        served = "cuFile compatibility mode (cuFile loaded, GDS not available)"
    else:
        served = "cuFile (GDS availability unknown: this kvikio does not report driver properties)"
    return {"kvikio_compat_mode": str(mode), "gds_available": gds_available, "served_by": served,
            "real_gds": bool(gds_available and not compat), "gds_driver_note": reason}


def _is_on(mode: Any) -> bool:
    if isinstance(mode, bool):
        return mode
    text = str(getattr(mode, "name", mode)).upper()
    return text.endswith("ON") or text in ("TRUE", "1")


class GdsProbe(Probe):
    name = "storage_gds"

    def __init__(self, config: Config):
        self.config = config
        self._kvikio: Any = None
        self._buf: Any = None
        self._file = os.path.join(config.path, "gds-data.bin")

    def unavailable_reason(self) -> str | None:
        return unavailable_reason()

    def _kv(self) -> Any:
        if self._kvikio is None:
            reason = self.unavailable_reason()
            if reason:
                raise ProbeUnavailable(reason)
            self._kvikio = _import_kvikio()
            defaults = self._kvikio.defaults
            if hasattr(defaults, "num_threads_reset"):      # kvikio 24-25
                defaults.num_threads_reset(self.config.threads)
            elif hasattr(defaults, "set"):                  # kvikio 26
                defaults.set("num_threads", self.config.threads)
        return self._kvikio

    def implementation(self) -> dict[str, Any]:
        kv = self._kv()
        return {"engine": f"kvikio {getattr(kv, '__version__', '?')} CuFile pread/pwrite",
                "task_bytes": self.config.task_bytes, "threads": self.config.threads, **io_path(kv)}

    def cases(self) -> list[Case]:
        # Reads need the file the write of the same size left behind: write first.
        order = [op for op in OPS if op in self.config.ops]
        return [Case(op, size) for size in self.config.sizes for op in order]

    def prepare(self, case: Case) -> None:
        import torch

        self._kv()
        self._buf = torch.empty(case.size_bytes, dtype=torch.uint8, device="cuda")
        if case.op == "write":
            self._buf.copy_(_pattern(case.size_bytes).to("cuda"))
        elif not os.path.exists(self._file) or os.path.getsize(self._file) < case.size_bytes:
            self._write_once(case.size_bytes, _pattern(case.size_bytes).to("cuda"))
        torch.cuda.synchronize()

    def _write_once(self, size: int, buf: Any) -> float:
        kv = self._kv()
        start = time.perf_counter()
        with kv.CuFile(self._file, "w") as handle:
            written = handle.pwrite(buf, size, 0, task_size=self.config.task_bytes).get()
            os.fsync(handle.fileno())
        if written != size:
            raise RunError(f"GDS write to {self._file} wrote {written} of {size} bytes (disk full?)")
        return time.perf_counter() - start

    def run_once(self, case: Case) -> Timed:
        if case.op == "write":
            return Timed(self._write_once(case.size_bytes, self._buf))
        _drop_cache(self._file)
        kv = self._kv()
        start = time.perf_counter()
        with kv.CuFile(self._file, "r") as handle:
            got = handle.pread(self._buf, case.size_bytes, 0, task_size=self.config.task_bytes).get()
        elapsed = time.perf_counter() - start
        if got != case.size_bytes:
            raise RunError(f"GDS read from {self._file} returned {got} of {case.size_bytes} bytes")
        return Timed(elapsed)

    def sync(self) -> None:
        import torch

        torch.cuda.synchronize()

    def check(self, case: Case) -> int:
        if case.op == "write":
            with open(self._file, "rb") as handle:
                data = handle.read(case.size_bytes)
            import torch

            got = torch.frombuffer(bytearray(data), dtype=torch.uint8)
            return int((got != _pattern(case.size_bytes)).sum().item())
        self._buf.zero_()
        self.run_once(case)
        return int((self._buf.cpu() != _pattern(case.size_bytes)).sum().item())

    def release(self, case: Case) -> None:
        self._buf = None

    def metrics(self, case: Case, time_s: float) -> dict[str, Any]:
        gbps = case.size_bytes / time_s / 1e9
        return {"write_gbps": gbps} if case.op == "write" else {"read_gbps": gbps}


def _pattern(size: int) -> Any:
    import torch

    return (torch.arange(size, dtype=torch.int64) % 251).to(torch.uint8)


def _drop_cache(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


SPEC = ProbeSpec(
    name="storage_gds", command=("storage", "gds"), order=55,
    help="GPUDirect Storage file <-> GPU memory through kvikio (cuFile)",
    metrics=("write_gbps", "read_gbps"), config=Config, build=lambda config, context=None: GdsProbe(config),
    row_schema=GdsRow,
    cli="microbench.commands.storage_gds", needs=Needs(target=True, gpu=True), aliases=(),
    feeds=("tier",),
    suite=(),
)
