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
from dataclasses import dataclass
from typing import Any

from ...core.errors import ProbeUnavailable, RunError, UsageError
from ...core.options import nbytes, one_of, option, positive_int, size_range
from ...core.probe import Case, Probe, Timed
from ...core.registry import Needs, ProbeSpec, SweepDefaults
from ...results.schema import ProbeRow

OPS = ("write", "read")


@dataclass
class Config:
    base: str = option(flag="--path", metavar="PATH", record=False,
                       help="directory to test; the run writes only inside a unique directory it creates there "
                            "and removes afterwards")
    sizes: list[int] = option([1 << 30], parse=size_range, flag="--size", shown="1G",
                              help="bytes per transfer, e.g. 1G or 256M,1G")
    ops: list[str] = option(list(OPS), parse=one_of(OPS), flag="--rw", shown="write,read", help="write, read or both")
    task_bytes: int = option(16 << 20, parse=nbytes, flag="--bs", shown="16M",
                             help="kvikio task size: bytes per pread/pwrite")   # one pread/pwrite per task
    threads: int = option(4, parse=positive_int, help="kvikio thread pool size")
    keep: bool = option(False, switch=True, record=False, help="keep the data file")
    path: str = ""                  # the run's own directory (created and removed by the run)


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
        return "kvikio is not installed (pip install kvikio-cu13 beside torch 2.13's CUDA 13 build: the gpu extra)"
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
    from ...world.policy import gpu_count

    return gpu_count()


def io_path(kvikio: Any) -> dict[str, Any]:
    """Which path serves the bytes, in kvikio's own words. The compat mode asked for
    (KVIKIO_COMPAT_MODE, default AUTO) is not the answer: AUTO means "ON when cuFile cannot be
    used" (kvikio's defaults.cpp, infer_compat_mode_if_auto). kvikio.defaults.is_compat_mode_preferred()
    (kvikio >= 24.10) resolves it; older kvikio only has compat_mode() as a bool. When cuFile is
    used, kvikio.cufile_driver's DriverProperties.is_gds_available says whether nvidia-fs does the
    DMA; kvikio returns False there when the driver raised (cufile_driver.pyx), so False means
    "cuFile's own compatibility mode", not necessarily "GDS absent"."""
    defaults = kvikio.defaults
    if hasattr(defaults, "get"):            # kvikio 25.02+: defaults.get("compat_mode") -> CompatMode
        mode = defaults.get("compat_mode")
    else:
        mode = defaults.compat_mode()
    if hasattr(defaults, "is_compat_mode_preferred"):
        compat = bool(defaults.is_compat_mode_preferred())
        answered_by = "kvikio.defaults.is_compat_mode_preferred()"
    else:
        compat = _is_on(mode)
        answered_by = "kvikio.defaults.compat_mode() (this kvikio has no is_compat_mode_preferred)"
    gds_available: bool | None = None
    reason = None
    if not compat:
        try:
            import kvikio.cufile_driver as driver

            props = getattr(driver, "properties", None)
            if props is None and hasattr(driver, "DriverProperties"):
                props = driver.DriverProperties()
            gds_available = bool(props.is_gds_available) if props is not None else None
            if gds_available is False:
                reason = "kvikio's DriverProperties.is_gds_available is False (no nvidia-fs, or the driver raised)"
        except Exception as exc:  # the driver refused to open: cuFile still serves in its compat mode
            gds_available, reason = (
                False,
                str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__,
            )
    if compat:
        served = "kvikio compat mode (POSIX + host bounce buffer, cuFile not used)"
    elif gds_available:
        served = "GPUDirect Storage (cuFile, GDS available)"
    elif gds_available is False:
        served = "cuFile compatibility mode (cuFile loaded, GDS not available)"
    else:
        served = "cuFile (GDS availability unknown: this kvikio does not report driver properties)"
    return {"kvikio_compat_mode": str(getattr(mode, "name", mode)), "kvikio_compat_mode_preferred": compat,
            "compat_answer_from": answered_by, "gds_available": gds_available, "served_by": served,
            "real_gds": bool(gds_available and not compat), "gds_driver_note": reason}


def _is_on(mode: Any) -> bool:
    if isinstance(mode, bool):
        return mode
    text = str(getattr(mode, "name", mode)).upper().rsplit(".", 1)[-1]
    return text in ("ON", "TRUE", "1")


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
        fill_pattern(self._buf)  # filled on the GPU from one tile: no host copy of the transfer
        if case.op != "write" and (not os.path.exists(self._file) or os.path.getsize(self._file) < case.size_bytes):
            self._write_once(case.size_bytes, self._buf)
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
            return file_pattern_mismatches(self._file, case.size_bytes)
        self._buf.zero_()
        self.run_once(case)
        return count_pattern_mismatches(self._buf)  # on the GPU, a chunk at a time

    def release(self, case: Case) -> None:
        self._buf = None

    def metrics(self, case: Case, time_s: float) -> dict[str, Any]:
        gbps = case.size_bytes / time_s / 1e9
        return {"write_gbps": gbps} if case.op == "write" else {"read_gbps": gbps}


# The check pattern: byte i holds i mod 251 (a prime, so no power-of-two stride aliases it).
PATTERN_PERIOD = 251
# Checks compare this much at a time: host memory for the check stays O(chunk), not O(size)
# (a whole-size int64 index for 1 GiB was 8 GiB, plus the comparison's temporaries). A multiple
# of the period, so every chunk starts at pattern phase 0.
CHECK_CHUNK_BYTES = PATTERN_PERIOD * (256 << 10)


def _tile(device: Any = "cpu") -> Any:
    import torch

    return torch.arange(PATTERN_PERIOD, dtype=torch.uint8, device=device)


def fill_pattern(buf: Any) -> Any:
    """Write the pattern into a flat uint8 tensor in place, from one 251-byte tile."""
    tile = _tile(buf.device)
    count = buf.numel()
    full = count // PATTERN_PERIOD * PATTERN_PERIOD
    if full:
        buf[:full].view(-1, PATTERN_PERIOD).copy_(tile.expand(full // PATTERN_PERIOD, PATTERN_PERIOD))
    if count > full:
        buf[full:].copy_(tile[:count - full])
    return buf


def count_pattern_mismatches(data: Any) -> int:
    """Bytes of a flat uint8 tensor (starting at pattern phase 0) that differ from the pattern,
    compared one CHECK_CHUNK_BYTES slice at a time."""
    tile = _tile(data.device)
    wrong = 0
    for start in range(0, data.numel(), CHECK_CHUNK_BYTES):
        chunk = data[start:start + CHECK_CHUNK_BYTES]
        full = chunk.numel() // PATTERN_PERIOD * PATTERN_PERIOD
        if full:
            wrong += int((chunk[:full].view(-1, PATTERN_PERIOD) != tile).sum().item())
        if chunk.numel() > full:
            wrong += int((chunk[full:] != tile[:chunk.numel() - full]).sum().item())
    return wrong


def file_pattern_mismatches(path: str, size: int) -> int:
    """count_pattern_mismatches over the first `size` bytes of a file, read a chunk at a time;
    bytes the file lacks count as wrong."""
    import torch

    wrong, done = 0, 0
    with open(path, "rb") as handle:
        while done < size:
            data = handle.read(min(CHECK_CHUNK_BYTES, size - done))
            if not data:
                break
            wrong += count_pattern_mismatches(torch.frombuffer(bytearray(data), dtype=torch.uint8))
            done += len(data)
    return wrong + (size - done)


def _drop_cache(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def run(spec: Any, config: Config, inv: Any) -> Any:
    """The run's own directory under --path, created and removed here; skipped with the reason
    before it exists when GDS cannot run."""
    from dataclasses import replace

    from ...core.units import format_bytes_human
    from ...run.runner import run_probe, skip
    from ...targets import checkpoint_target as ct

    reason = unavailable_reason()
    if reason:
        skip(GdsProbe.name, f"storage gds: {reason}", replace(config, path=config.base), inv.settings,
             json_path=inv.json_path, results_dir=inv.results_dir)
    target = ct.parse_target(config.base)
    if target.kind != "local":
        raise UsageError(f"invalid --path {config.base!r}: GDS needs a local or mounted file system path, "
                         f"e.g. /mnt/nvme")
    run_dir = ct.RunDir(target, ct.unique_name().replace("ckpt", "gds"))
    run_dir.create()
    try:
        ct.check_free_space(run_dir.root, max(config.sizes) + ct.SPACE_MARGIN_BYTES,
                            f"a {format_bytes_human(max(config.sizes))} file")
        config = replace(config, path=run_dir.root)
        return run_probe(GdsProbe(config), inv.settings, config=config, json_path=inv.json_path,
                         results_dir=inv.results_dir)
    finally:
        if not config.keep:
            run_dir.remove()


def print_report(outcome: Any, config: Config) -> str | None:
    from ...core.tables import text_table
    from ...core.units import format_size

    impl = outcome.record["implementation"]
    table = [(r["op"], format_size(r["size_bytes"]), r["iters"], f"{r['time_us']['p50'] / 1e3:.1f}",
              f"{r.get('write_gbps', r.get('read_gbps')):.2f}", "N/A" if r["nwrong"] is None else r["nwrong"])
             for r in outcome.rows]
    print(f"# microbench storage gds: {impl['engine']}, served by {impl['served_by']}")
    print(text_table(table, headers=["op", "size", "iters", "time p50 (ms)", "GB/s", "#wrong"], tablefmt="simple"))
    print(f"# results: {outcome.path}")
    wrong = sum(r["nwrong"] or 0 for r in outcome.rows)
    return f"{wrong} wrong byte(s) after GDS transfers (see #wrong)" if wrong else None


SPEC = ProbeSpec(
    name="storage_gds", command=("storage", "gds"), order=55,
    help="GPUDirect Storage file <-> GPU memory through kvikio (cuFile)",
    description="Write and read a file from GPU memory with kvikio's CuFile; the record says whether real GDS or a "
                "compatibility mode served the bytes.",
    metrics=("write_gbps", "read_gbps"), config=Config, build=lambda config, context=None: GdsProbe(config),
    row_schema=GdsRow, run=run, printer=print_report,
    sweep=SweepDefaults(warmup=1, iters=5, budget_s=10.0, check=True, check_flag=True),
    needs=Needs(target=True, gpu=True), aliases=(),
    feeds=("tier",),
    suite=(),
)
