"""The storage engine in pure Python, for when the native core is missing.

Same contract as the native `io_run`: threads x qd workers (Python has no io_uring, so queue
depth becomes more synchronous workers), each moving its own slice of one existing file with
os.preadv/os.pwritev from a page-aligned mmap buffer (O_DIRECT needs aligned memory), every
I/O timed. The syscalls release the GIL, so workers do overlap; per-I/O Python overhead makes
small blocks slower than native, which the record states as implementation "python".
"""

from __future__ import annotations

import mmap
import os
import random
import threading
import time
from typing import Any

from ..core.stats import percentile

_LAT_CAP = 1 << 20


def io_run(path: str, write: bool, bs: int, size: int, threads: int = 1, qd: int = 1, direct: bool = False,
           random_order: bool = False, fsync: bool = True, seed: int = 1) -> dict[str, Any]:
    if bs <= 0 or size <= 0 or threads < 1 or qd < 1:
        raise ValueError("bs, size, threads and qd must be positive")
    workers = threads * qd
    flags = (os.O_WRONLY if write else os.O_RDONLY) | (getattr(os, "O_DIRECT", 0) if direct else 0)
    fd = os.open(path, flags)
    try:
        if not write:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # read from the disk, not the cache
        slice_bytes = size // workers // bs * bs
        rng = random.Random(seed)
        plans = []
        for w in range(workers):
            order = list(range(slice_bytes // bs))
            if random_order:
                rng.shuffle(order)
            buf = mmap.mmap(-1, bs)
            if bs >= 2 << 20 and hasattr(mmap, "MADV_HUGEPAGE"):
                buf.madvise(mmap.MADV_HUGEPAGE)  # fewer pages for O_DIRECT to pin per I/O
            buf.write(rng.randbytes(bs))  # incompressible, so no storage layer can fake speed
            plans.append((w * slice_bytes, order, buf))
        lats: list[list[float]] = [[] for _ in range(workers)]
        errors: list[BaseException] = []
        ready = threading.Barrier(workers + 1)

        def work(index: int) -> None:
            start, order, buf = plans[index]
            view = memoryview(buf)
            mine = lats[index]
            stride = max(1, len(order) // _LAT_CAP + (1 if len(order) % _LAT_CAP else 0))
            ready.wait()
            try:
                for i, block in enumerate(order):
                    off = start + block * bs
                    t0 = time.perf_counter()
                    done = 0
                    while done < bs:
                        part = view[done:] if done else view
                        n = os.pwritev(fd, [part], off + done) if write else os.preadv(fd, [part], off + done)
                        if n == 0:
                            raise OSError(28 if write else 5, os.strerror(28 if write else 5), path)
                        done += n
                    if i % stride == 0:
                        mine.append((time.perf_counter() - t0) * 1e6)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller below
                errors.append(exc)
            finally:
                view.release()

        pool = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(workers)]
        for t in pool:
            t.start()
        ready.wait()
        t0 = time.perf_counter()
        for t in pool:
            t.join()
        if errors:
            raise errors[0]
        if write and fsync:
            os.fsync(fd)
        seconds = time.perf_counter() - t0
        for _, _, buf in plans:
            buf.close()
    finally:
        os.close(fd)
    samples = sorted(v for lat in lats for v in lat)
    ios = workers * (slice_bytes // bs)
    return {"bytes": ios * bs, "seconds": seconds, "iops": ios / seconds if seconds > 0 else 0.0, "ios": ios,
            "lat_p50_us": percentile(samples, 50), "lat_p99_us": percentile(samples, 99),
            "lat_p999_us": percentile(samples, 99.9), "lat_max_us": samples[-1] if samples else 0.0,
            "lat_mean_us": sum(samples) / len(samples) if samples else 0.0, "lat_samples": len(samples),
            "engine": "python threads", "workers": workers}
