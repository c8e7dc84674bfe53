"""The POSIX storage probe's option table (the workload flags it shares with fio, and its own) and
the checks made before any file is written."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...core.errors import UsageError
from ...core.options import choice, nbytes, one_of, option, positive_int, size_list
from ...core.units import format_size, format_size_exact
from ...targets import native
from ...targets.workdir import check_base, direct_alignment

RW = ("read", "write")
PATTERNS = ("seq", "rand")


def _expected(text: Any, flag: str) -> dict[str, Any] | None:
    from ...expect.overrides import override

    return override(text)


@dataclass
class Workload:
    """The workload flags posix and fio share, so both describe the same I/O."""

    path: str = option("/tmp", help="directory to test; a unique directory is created under it and removed afterwards")
    rw: list[str] = option(["read", "write"], parse=one_of(RW), help="read, write or both")
    bs: list[int] = option([1 << 20, 16 << 20], parse=size_list, shown="1M,16M", help="block sizes, binary units")
    threads: int = option(1, parse=positive_int, help="parallel workers, each its own slice of the file")
    qd: int = option(4, parse=positive_int, help="I/Os in flight per worker (io_uring)", shown="4")
    # None: O_DIRECT where the filesystem allows it, else buffered
    direct: bool | None = option(
        None,
        negative="--buffered",
        shown="",
        help="O_DIRECT (--direct) or the page cache (--buffered); default O_DIRECT where the filesystem allows it",
    )
    size: int = option(1 << 30, parse=nbytes, shown="1G", help="test file size")
    pattern: str = option("seq", parse=choice(PATTERNS), help="seq or rand")
    keep: bool = option(False, switch=True, help="keep the test directory and file afterwards")
    expected: dict | None = option(
        None,
        parse=_expected,
        metavar="RATE",
        record=False,
        switch=False,
        help="the throughput this hardware should reach, overriding what sysfs/NVML say, "
        "with a unit: e.g. 24GB/s or 200Gbit (results then show %% of it)",
        shown="",
    )
    space_check: bool = option(
        True,
        switch=True,
        switch_value=False,
        flag="--no-space-check",
        help="skip the free-space check (for filesystems that misreport free space)",
    )
    engine: str = "auto"  # auto, io_uring or threads


@dataclass
class Config(Workload):
    compare_fio: bool = option(
        False, switch=True, record=False, help="also run fio on the same file and print the ratio"
    )
    single_stream: bool = option(
        True,
        switch=True,
        switch_value=False,
        flag="--no-single-stream",
        help="skip the single-stream case (one buffered sequential writer of 16M blocks, "
        "fsync at the end, as torch.save writes) that runs beside the write cases",
    )


# The native engine gives each worker one io_uring of `qd` entries (native/io_engine.c, ring_init):
# io_uring_setup refuses more than the kernel's IORING_MAX_ENTRIES, 32768, with EINVAL, which
# the engine could only report as a failed I/O (once blamed on O_DIRECT alignment). Without
# io_uring the same qd becomes threads x qd synchronous workers, one pthread each.
MAX_QD = 32768


def validate(config: Workload) -> Workload:
    """Flag checks that need no file system access, and a --path this user can write."""
    check_base(config.path, writable=True)
    if config.qd > MAX_QD:
        raise UsageError(
            f"invalid --qd {config.qd}: the native engine takes at most {MAX_QD} I/Os in flight per "
            f"worker (io_uring's limit per ring); use e.g. --qd 64, or more --threads"
        )
    workers = config.threads * config.qd
    limit = _thread_limit()
    if expected_engine(config) != "io_uring" and limit is not None and workers > limit:
        raise UsageError(
            f"invalid --qd {config.qd} with --threads {config.threads}: without io_uring the engine "
            f"runs threads x qd = {workers} synchronous workers, one thread each, more than the "
            f"{limit} this machine allows (half of threads-max); use e.g. --qd 64"
        )
    from ...targets.mount.facts import facts_for_path

    on_mount = facts_for_path(config.path)
    if on_mount and on_mount.get("mount_mode") == "direct":
        # rclone without a write cache takes only one sequential pass per new file; the engine
        # rewrites a file in place at offsets (EPERM there).
        raise UsageError(
            f"--path {config.path!r} is a direct bucket mount, which takes only sequential writes of new "
            f"files; use a --mode cached mount, or `microbench storage mount --mode direct`"
        )
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
