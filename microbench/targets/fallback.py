"""The native core's loops in pure Python, for when it is missing: the storage engine (io_run),
the memory copy (memcpy_run) and the TCP link loop (tcp_link), each with its native twin's
contract; targets/native.py picks one or the other.

io_run, same contract as the native one: threads x qd workers (Python has no io_uring, so queue
depth becomes more synchronous workers), each moving its own slice of one existing file with
os.preadv/os.pwritev from a page-aligned mmap buffer (O_DIRECT needs aligned memory), every
I/O timed. The syscalls release the GIL, so workers do overlap; per-I/O Python overhead makes
small blocks slower than native, which the record states as implementation "python".
"""

from __future__ import annotations

import errno
import mmap
import os
import random
import selectors
import socket
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


def memcpy_run(size_bytes: int, threads: int, iters: int) -> list[float]:
    """Seconds per iteration to copy size_bytes with `threads` threads (native memcpy_bandwidth's twin)."""
    # numpy's copy releases the GIL for large arrays, so threads do run in parallel.
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    # Both buffers written before timing: np.zeros would map lazily-zeroed pages, and the
    # first timed copy would pay every page fault of dst, many times the copy itself
    # (docs/BENCHMARKS.md has the figures).
    # numpy advises arrays this large as transparent huge pages, as the native core does.
    src = np.full(size_bytes, 0x5A, dtype=np.uint8)
    dst = np.empty(size_bytes, dtype=np.uint8)
    dst.fill(0)
    bounds = [(size_bytes * t // threads, size_bytes * (t + 1) // threads) for t in range(threads)]

    def copy(bound: tuple[int, int]) -> None:
        np.copyto(dst[bound[0]:bound[1]], src[bound[0]:bound[1]])

    times = []
    with ThreadPoolExecutor(max_workers=threads) as pool:
        for _ in range(iters):
            start = time.perf_counter()
            list(pool.map(copy, bounds))
            times.append(time.perf_counter() - start)
    return times


def _drive(fds: list[socket.socket], send_left: list[int], recv_left: list[int], timeout_s: float, buf: bytes,
           first_rx: list[float] | None = None) -> None:
    """Python twin of drive() in native/tcp_link.c: same protocol, same timeout semantics."""
    last = time.perf_counter()
    view = memoryview(buf)
    with selectors.DefaultSelector() as sel:
        while True:
            moved = busy = False
            for i, fd in enumerate(fds):
                if send_left[i]:
                    try:
                        k = fd.send(view[:min(send_left[i], len(buf))])
                    except BlockingIOError:
                        k = 0
                    send_left[i] -= k
                    moved |= k > 0
                if recv_left[i]:
                    try:
                        data = fd.recv(min(recv_left[i], len(buf)))
                    except BlockingIOError:
                        data = None
                    if data is not None:
                        if not data:
                            raise OSError(errno.ECONNRESET, os.strerror(errno.ECONNRESET))
                        if first_rx is not None and not first_rx:
                            first_rx.append(time.perf_counter())
                        recv_left[i] -= len(data)
                        moved = True
                busy |= bool(send_left[i] or recv_left[i])
            if not busy:
                return
            now = time.perf_counter()
            if moved:
                last = now
                continue
            left = timeout_s - (now - last)
            if left <= 0:
                raise OSError(errno.ETIMEDOUT, os.strerror(errno.ETIMEDOUT))
            for i, fd in enumerate(fds):
                events = (selectors.EVENT_WRITE if send_left[i] else 0) | (selectors.EVENT_READ if recv_left[i] else 0)
                if events:
                    sel.register(fd, events)
            sel.select(min(left, 0.1))
            for i, fd in enumerate(fds):
                if send_left[i] or recv_left[i]:
                    sel.unregister(fd)


def tcp_link(fds: list[socket.socket], role: int, mode: int, size: int, iters: int, timeout_s: float) -> list[float]:
    """The link probe's loop (native/tcp_link.c's tcp_link): seconds per iteration over connected
    non-blocking sockets; mode 0 one way (role 0 sends), 1 both ways at once, 2 ping-pong."""
    buf = b"\x5a" * min(size, 1 << 20)
    n = len(fds)
    parts = [size // n + (1 if i < size % n else 0) for i in range(n)]
    zero = [0] * n
    times, prev_end = [], 0.0
    for _ in range(iters):
        t0 = time.perf_counter()
        first: list[float] = []
        if mode == 0 and role == 0:
            _drive(fds, list(parts), list(zero), timeout_s, buf)
            _drive(fds, list(zero), [1] + zero[1:], timeout_s, buf)
            times.append(time.perf_counter() - t0)
        elif mode == 0:
            _drive(fds, list(zero), list(parts), timeout_s, buf, first)
            _drive(fds, [1] + zero[1:], list(zero), timeout_s, buf)
            times.append(time.perf_counter() - (first[0] if first else t0))
        elif mode == 1:
            _drive(fds, [1] + zero[1:], [1] + zero[1:], timeout_s, buf)
            t0 = time.perf_counter()
            _drive(fds, list(parts), list(parts), timeout_s, buf)
            times.append(time.perf_counter() - t0)
        elif role == 0:
            _drive(fds[:1], [size], [0], timeout_s, buf)
            _drive(fds[:1], [0], [size], timeout_s, buf)
            times.append(time.perf_counter() - t0)
        else:
            _drive(fds[:1], [0], [size], timeout_s, buf, first)
            _drive(fds[:1], [size], [0], timeout_s, buf)
            end = time.perf_counter()
            times.append(end - (prev_end or (first[0] if first else t0)))
            prev_end = end
    return times
