"""File read/write throughput through the native POSIX engine (and fio, for comparison).

Each case is (rw, bs). The engine moves the whole test file once per iteration: `threads`
workers with queue depth `qd` each (io_uring, else threads x qd synchronous workers), every
worker its own contiguous slice; `seq` walks a slice in order, `rand` visits each of its blocks
once in random order (fio's random map). Bandwidth = bytes moved / seconds, GB/s = 1e9 B/s,
where for writes the seconds include the final fsync (bytes not yet durable were not written)
and for reads the file's cached pages are dropped first (posix_fadvise DONTNEED) or bypassed
(O_DIRECT). Results that memory served are flagged (`served_from_memory`), not reported as
disk speed: anything on a memory-backed filesystem (tmpfs, ramfs); a buffered result at
CEILING_FRACTION or more of the host's memcpy bandwidth (a copy out of the page cache costs about
one memcpy); any result faster than memcpy itself (`above_memory_ceiling`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from ...core.errors import UsageError
from ...core.options import choice, nbytes, one_of, option, positive_int, size_list
from ...core.probe import Case, Probe, Timed
from ...core.registry import Needs, ProbeSpec, SuiteStep, SweepDefaults
from ...core.units import format_size, format_size_exact
from ...results.schema import ProbeRow
from ...targets import native
from ...targets.workdir import IOFailure, WorkDir, check_base, check_free_space, direct_alignment
from ..memory import usable_cores
from .report import print_report, run_storage

RW = ("read", "write")
PATTERNS = ("seq", "rand")
# A copy out of the page cache costs about a memcpy, so a buffered result at this share of the
# memcpy rate came from memory. Below it a fast array is still believable.
CEILING_FRACTION = 0.8
MEMORY_FILESYSTEMS = ("tmpfs", "ramfs", "hugetlbfs", "devtmpfs")
DATA_FILE = "data.bin"
# The single-stream case: one buffered writer of blocks this large, fsync at the end, the way
# torch.save writes a full state dict (one process, one file, through the page cache).
STREAM_BS = 16 << 20


def _expected(text: Any, flag: str) -> dict[str, Any] | None:
    from ...expect.overrides import override

    return override(text)


@dataclass
class Workload:
    """The workload flags posix and fio share, so both describe the same I/O."""

    path: str = option("/tmp", help="directory to test; a unique directory is created under it and removed "
                                    "afterwards")
    rw: list[str] = option(["read", "write"], parse=one_of(RW), help="read, write or both")
    bs: list[int] = option([1 << 20, 16 << 20], parse=size_list, shown="1M,16M", help="block sizes, binary units")
    threads: int = option(1, parse=positive_int, help="parallel workers, each its own slice of the file")
    qd: int = option(4, parse=positive_int, help="I/Os in flight per worker (io_uring)", shown="4")
    # None: O_DIRECT where the filesystem allows it, else buffered
    direct: bool | None = option(None, negative="--buffered", shown="",
                                 help="O_DIRECT (--direct) or the page cache (--buffered); default O_DIRECT where "
                                      "the filesystem allows it")
    size: int = option(1 << 30, parse=nbytes, shown="1G", help="test file size")
    pattern: str = option("seq", parse=choice(PATTERNS), help="seq or rand")
    keep: bool = option(False, switch=True, help="keep the test directory and file afterwards")
    expected: dict | None = option(None, parse=_expected, metavar="RATE", record=False, switch=False,
                                   help="the throughput this hardware should reach, overriding what sysfs/NVML say, "
                                        "with a unit: e.g. 24GB/s or 200Gbit (results then show %% of it)", shown="")
    space_check: bool = option(True, switch=True, switch_value=False, flag="--no-space-check",
                               help="skip the free-space check (for filesystems that misreport free space)")
    engine: str = "auto"  # auto, io_uring or threads


@dataclass
class Config(Workload):
    compare_fio: bool = option(False, switch=True, record=False,
                               help="also run fio on the same file and print the ratio")
    single_stream: bool = option(True, switch=True, switch_value=False, flag="--no-single-stream",
                                 help="skip the single-stream case (one buffered sequential writer of 16M blocks, "
                                      "fsync at the end, as torch.save writes) that runs beside the write cases")


# The native engine gives each worker one io_uring of `qd` entries (native/io_engine.c, ring_init):
# io_uring_setup refuses more than the kernel's IORING_MAX_ENTRIES, 32768, with EINVAL, which
# the engine could only report as a failed I/O (once blamed on O_DIRECT alignment). Without
# io_uring the same qd becomes threads x qd synchronous workers, one pthread each.
MAX_QD = 32768


def validate(config: Workload) -> Workload:
    """Flag checks that need no file system access, and a --path this user can write."""
    check_base(config.path, writable=True)
    if config.qd > MAX_QD:
        raise UsageError(f"invalid --qd {config.qd}: the native engine takes at most {MAX_QD} I/Os in flight per "
                         f"worker (io_uring's limit per ring); use e.g. --qd 64, or more --threads")
    workers = config.threads * config.qd
    limit = _thread_limit()
    if expected_engine(config) != "io_uring" and limit is not None and workers > limit:
        raise UsageError(f"invalid --qd {config.qd} with --threads {config.threads}: without io_uring the engine "
                         f"runs threads x qd = {workers} synchronous workers, one thread each, more than the "
                         f"{limit} this machine allows (half of threads-max); use e.g. --qd 64")
    from ...targets.mount.facts import facts_for_path

    on_mount = facts_for_path(config.path)
    if on_mount and on_mount.get("mount_mode") == "direct":
        # rclone without a write cache takes only one sequential pass per new file; the engine
        # rewrites a file in place at offsets (EPERM there).
        raise UsageError(f"--path {config.path!r} is a direct bucket mount, which takes only sequential writes of new "
                         f"files; use a --mode cached mount, or `microbench storage mount --mode direct`")
    for bs in config.bs:
        if config.size < bs * config.threads * config.qd:
            raise UsageError(
                f"--size {format_size_exact(config.size)} is too small for --bs {format_size_exact(bs)} with "
                f"{config.threads} thread(s) x qd {config.qd}: each of the "
                f"{config.threads * config.qd} I/O streams needs at least one block; e.g. "
                f"--size {format_size_exact(bs * config.threads * config.qd * 4)}"
            )
    if config.direct is not False:
        align = direct_alignment(config.path)
        for bs in config.bs:
            if bs % align:
                raise UsageError(
                    f"invalid --bs {format_size_exact(bs)!r}: with O_DIRECT the block size must be a multiple "
                    f"of {format_size(align)} (buffer, offset and length alignment); use e.g. --bs "
                    f"{format_size_exact(max(align, bs // align * align))} or --buffered"
                )
    return config


def _thread_limit() -> int | None:
    """Half of the kernel's threads-max: the rest stays for everything else running."""
    try:
        with open("/proc/sys/kernel/threads-max") as handle:
            return int(handle.read()) // 2
    except (OSError, ValueError):
        return None


def expected_engine(config: Workload) -> str:
    if not native.available():
        return "python threads"
    if config.engine == "threads" or config.qd == 1:
        return "pthreads"
    return "io_uring" if native.io_uring_available() else "pthreads"


# The engines (native, fio, python) name latencies lat_p50_us; a row's names follow the metric
# naming rule of results/schema.py, the unit before the statistic.
ENGINE_TO_ROW = {"lat_p50_us": "lat_us_p50", "lat_p99_us": "lat_us_p99", "lat_p999_us": "lat_us_p999",
                 "lat_max_us": "lat_us_max"}


class _StorageRequired(ProbeRow):
    tool: str                       # "posix" (microbench's engine) or "fio"
    bs_bytes: int
    file_size_bytes: int
    threads: int
    qd: int
    pattern: str
    direct: bool
    memory_ceiling_gbps: float
    above_memory_ceiling: bool
    served_from_memory: bool
    note: str | None


class _StreamRow(_StorageRequired, total=False):
    stream: str                     # "single": the single-stream case (compose's single-writer bandwidth)


class StorageRow(_StreamRow, total=False):
    write_gbps: float               # by op
    read_gbps: float
    # The engine's own figures, medians over iterations.
    iops: float
    lat_us_p50: float
    lat_us_p99: float
    lat_us_p999: float
    lat_us_max: float
    engine: str
    workers: float
    total_bytes: float


class Target:
    """The work directory, its data file (written once before any timed case) and the facts
    the record states about it. Use as a context manager: leaving it removes what it made."""

    def __init__(self, config: Config):
        validate(config)
        self.config = config
        if config.space_check:
            check_free_space(config.path, self.needed_bytes(config), f"a {format_size(config.size)} test file")
        self.workdir = WorkDir(config.path, keep=config.keep, prefix="microbench-storage-")
        try:
            ok, reason = self.workdir.probe_direct()
            if config.direct and not ok:
                raise UsageError(f"--direct asked for O_DIRECT but {reason}; use --buffered (reads then come from "
                                 f"memory and are flagged so)")
            self.direct = bool(ok and config.direct is not False)
            self.direct_note = None if self.direct or config.direct is False else f"{reason}; ran buffered"
            try:
                self.data = self.workdir.new_file(DATA_FILE)
            except OSError as exc:
                raise IOFailure(f"creating the test file in {self.workdir.path}").error(exc) from None
            self._layout()
            self.ceiling_gbps, self.plain_copy_gbps = memory_ceilings()
            self.memory_backed = self.workdir.facts()["filesystem"] in MEMORY_FILESYSTEMS
        except BaseException:
            self.workdir.cleanup()
            raise

    @staticmethod
    def needed_bytes(config: Config) -> int:
        return config.size + (1 << 20)

    def _layout(self) -> None:
        """Fill the file with incompressible bytes so reads read real blocks, not holes."""
        bs = max(self.config.bs)
        try:
            native.io_run(str(self.data), True, bs, self.config.size, threads=1, qd=1,
                          direct=self.direct and bs % direct_alignment(self.config.path) == 0)
        except OSError as exc:
            raise IOFailure(f"writing the {format_size(self.config.size)} test file in {self.workdir.path}").error(
                exc
            ) from None

    def facts(self) -> dict[str, Any]:
        return {**self.workdir.facts(), "data_file": str(self.data), "direct_requested": self.config.direct,
                "direct_in_effect": self.direct, "direct_note": self.direct_note,
                "memory_ceiling_gbps": self.ceiling_gbps, "memory_plain_copy_gbps": self.plain_copy_gbps,
                "cache_drop": "O_DIRECT" if self.direct else "posix_fadvise(DONTNEED) before each read"}

    def cleanup(self) -> None:
        self.workdir.cleanup()

    def __enter__(self) -> "Target":
        return self

    def __exit__(self, *exc: object) -> None:
        self.cleanup()


def memory_ceiling_gbps(size_bytes: int = 64 << 20, iters: int = 8) -> float:
    """Host memcpy bandwidth, the best of one thread and all cores over a few tries (other
    work on the machine only ever lowers it): no storage result can honestly exceed it."""
    return memory_ceilings(size_bytes, iters)[0]


def memory_ceilings(size_bytes: int = 64 << 20, iters: int = 8) -> tuple[float, float]:
    """(fastest copy, plain libc memcpy) in GB/s. The fastest (streaming stores where they win)
    bounds every result; a buffered read is the kernel copying out of the page cache with
    ordinary stores, so "at least 80% of memcpy" is judged against the plain copy."""
    fastest = plain = float("inf")
    for threads in {1, usable_cores()}:
        times, kernel = native.memcpy_run(size_bytes, threads, iters)
        fastest = min(fastest, min(times))
        if kernel in ("libc", "numpy"):
            plain = min(plain, min(times))
        elif native.available():
            plain = min(plain, min(native.memcpy_run(size_bytes, threads, iters, "libc")[0]))
    return size_bytes / fastest / 1e9, size_bytes / plain / 1e9


class PosixProbe(Probe):
    name = "storage_posix"
    tools: tuple[str, ...] = ("posix",)

    def __init__(self, config: Config, target: Target, tools: tuple[str, ...] | None = None):
        self.config = config
        self.target = target
        if tools is not None:
            self.tools = tools
        self._bytes: dict[Case, int] = {}

    def implementation(self) -> dict[str, Any]:
        impl: dict[str, Any] = {"engine": expected_engine(self.config), **self.target.facts()}
        if "fio" in self.tools:
            from .fio_engine import fio_version

            impl["fio_version"] = fio_version()
        return impl

    def cases(self) -> list[Case]:
        cases = [
            Case(rw, bs, (("tool", tool),)) for rw in self.config.rw for bs in self.config.bs for tool in self.tools
        ]
        if getattr(self.config, "single_stream", False) and "write" in self.config.rw and "posix" in self.tools:
            cases.append(Case("write", min(STREAM_BS, self.config.size), (("tool", "posix"), ("stream", "single"))))
        return cases

    def row_fields(self, case: Case) -> dict[str, Any]:
        c = self.config
        if case.param("stream") == "single":
            return {"bs_bytes": case.size_bytes, "file_size_bytes": c.size, "threads": 1, "qd": 1, "pattern": "seq",
                    "direct": False, "stream": "single"}
        return {"bs_bytes": case.size_bytes, "file_size_bytes": c.size, "threads": c.threads, "qd": c.qd,
                "pattern": c.pattern, "direct": self.target.direct}

    def run_once(self, case: Case) -> Timed:
        c = self.config
        write = case.op == "write"
        if case.param("tool") == "fio":
            from .fio_engine import run_fio

            result = run_fio(str(self.target.data), write=write, bs=case.size_bytes, size=c.size, threads=c.threads,
                             qd=c.qd, direct=self.target.direct, random_order=c.pattern == "rand",
                             engine=expected_engine(c))
        elif case.param("stream") == "single":
            try:
                result = native.io_run(str(self.target.data), True, case.size_bytes, c.size, threads=1, qd=1,
                                       direct=False, engine="threads", fsync=True)
            except OSError as exc:
                raise IOFailure(f"single-stream write of {format_size(case.size_bytes)} blocks on "
                                f"{self.target.data}").error(exc) from None
        else:
            try:
                result = native.io_run(str(self.target.data), write, case.size_bytes, c.size, threads=c.threads,
                                       qd=c.qd, direct=self.target.direct, random_order=c.pattern == "rand",
                                       engine=c.engine, seed=os.getpid())
            except OSError as exc:
                raise IOFailure(f"{case.op} {format_size(case.size_bytes)} blocks on {self.target.data}").error(
                    exc
                ) from None
        self._bytes[case] = int(result["bytes"])
        extra = {ENGINE_TO_ROW.get(k, k): result[k] for k in ("iops", "lat_p50_us", "lat_p99_us", "lat_p999_us",
                                                             "lat_max_us", "engine", "workers") if k in result}
        extra["total_bytes"] = int(result["bytes"])
        return Timed(float(result["seconds"]), extra)

    def metrics(self, case: Case, time_s: float) -> dict[str, Any]:
        gbps = self._bytes.get(case, 0) / time_s / 1e9 if time_s > 0 else 0.0
        ceiling = self.target.ceiling_gbps
        above = gbps > ceiling
        plain = getattr(self.target, "plain_copy_gbps", ceiling)
        direct = self.target.direct and case.param("stream") != "single"
        cached = not direct and gbps >= CEILING_FRACTION * plain
        note = None
        if self.target.memory_backed:
            note = "memory-backed filesystem: measures memory, not a disk"
        elif above or cached:
            note = (f"{gbps:.2f} GB/s is {'above' if above else f'at least {CEILING_FRACTION:.0%} of'} memcpy "
                    f"({ceiling if above else plain:.2f} GB/s): served from memory, not disk speed")
        return {f"{case.op}_gbps": gbps, "memory_ceiling_gbps": ceiling, "above_memory_ceiling": above,
                "served_from_memory": note is not None, "note": note}

    def summarize(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        """fio vs posix ratio per (rw, bs) when both ran: posix GB/s / fio GB/s."""
        by: dict[tuple[str, int], dict[str, float]] = {}
        for row in rows:
            by.setdefault((row["op"], row["size_bytes"]), {})[row["tool"]] = row[f"{row['op']}_gbps"]
        ratios = [{"op": op, "bs_bytes": bs, "posix_gbps": v["posix"], "fio_gbps": v["fio"],
                   "ratio_posix_over_fio": v["posix"] / v["fio"] if v["fio"] else None}
                  for (op, bs), v in by.items() if "posix" in v and "fio" in v]
        return {"vs_fio": ratios} if ratios else {}


def _run(spec: Any, config: Config, inv: Any) -> Any:
    return run_storage(PosixProbe, Target, config, inv, compare_fio=config.compare_fio)


def case_words(key: str, row: dict[str, Any]) -> str | None:
    """A legend's words for a row: its I/O streams (threads x queue depth, each an outstanding
    request), and the single-stream case as one stream."""
    single = row.get("stream") == "single"
    if key == "stream" and single:
        return "1 stream"
    if key in ("threads", "qd"):
        streams = 1 if single else int(row.get("threads") or 1) * int(row.get("qd") or 1)
        return f"{streams} stream{'' if streams == 1 else 's'}"
    return None


SPEC = ProbeSpec(
    name="storage_posix", command=("storage", "posix"), order=40,
    help="file read/write GB/s, IOPS and latency (native pread/pwrite, io_uring, O_DIRECT)",
    description="Read and write one test file with the native engine; fsync is inside the timed write, cached "
                "pages are dropped before reads.",
    # No build: _run makes the probe inside its target (run_storage), which a context cannot.
    metrics=("write_gbps", "read_gbps", "iops"), config=Config,
    row_schema=StorageRow, validate=validate, run=_run, printer=print_report,
    sweep=SweepDefaults(warmup=1, iters=5, budget_s=2.0, check=False), needs=Needs(target=True), aliases=(),
    case_keys=("tool", "pattern", "bs_bytes", "threads", "qd", "stream"), case_words=case_words, feeds=("tier",),
    suite=(SuiteStep("storage posix", ("--path", "{path}", "--size", "256M"), ops=RW),),
)
