"""Loads the native core, or says why the pure-Python fallback runs instead.

Everything that has a native hot loop goes through this module, so a record can always state
which implementation measured it: `implementation()` -> {"native": bool, "reason": ...}.
MICROBENCH_NO_NATIVE=1 forces the fallback at run time (tests use it to cover both paths).
"""

from __future__ import annotations

import importlib
import os
import socket
from typing import Any

_module: Any = None
_reason: str | None = None


def _load() -> None:
    global _module, _reason
    if os.environ.get("MICROBENCH_NO_NATIVE", "") not in ("", "0"):
        _reason = "MICROBENCH_NO_NATIVE is set"
        return
    try:
        _module = importlib.import_module("microbench._native")
    except ImportError as exc:
        _reason = f"native module not built ({exc}); reinstall with a C compiler for native speed"


_load()


def available() -> bool:
    return _module is not None


def module() -> Any:
    """The compiled module, or None under the fallback."""
    return _module


def implementation() -> dict[str, Any]:
    return {"native": _module is not None, "name": "native" if _module is not None else "python",
            "fallback_reason": _reason}


def fallback_warning() -> str | None:
    """One loud line for the top of a measuring command's output when the Python fallback runs
    although nobody asked for it (MICROBENCH_NO_NATIVE): its figures are the interpreter's, not
    the machine's, and a record saying "python" is easy to miss."""
    if _module is not None or os.environ.get("MICROBENCH_NO_NATIVE", "") not in ("", "0"):
        return None
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # microbench/, above targets/
    checkout = os.path.dirname(package)
    if os.path.exists(os.path.join(checkout, "CMakeLists.txt")):
        fix = (f"this is the checkout {checkout}: build the core in place (cmake -S . -B build && cmake --build build) "
               f"or run the installed `microbench` from another directory")
    else:
        # Never the name from an index: on PyPI `microbench` is an unrelated project.
        fix = ("reinstall with a C compiler from the microbench checkout "
               "(cd microbench && pip install --force-reinstall --no-deps .)")
    return (f"WARNING: the native core is missing from {package}, so every figure below is the pure-Python "
            f"fallback's, not the machine's ({_reason}); {fix}")


def memcpy_bandwidth(size_bytes: int, threads: int = 1, iters: int = 5) -> list[float]:
    """Seconds per iteration to copy size_bytes with `threads` threads (the faster kernel)."""
    return memcpy_run(size_bytes, threads, iters)[0]


def memcpy_run(size_bytes: int, threads: int = 1, iters: int = 5, kernel: str = "auto") -> tuple[list[float], str]:
    """(seconds per iteration, kernel that ran): native "libc" memcpy or "stream" (non-temporal
    stores); "auto" keeps the faster on this machine. The fallback's kernel is "numpy"."""
    if _module is not None:
        times, used = _module.memcpy_bandwidth(size_bytes, threads, iters, kernel)
        return list(times), used
    from .fallback import memcpy_run as python_memcpy_run

    return python_memcpy_run(size_bytes, threads, iters), "numpy"


def io_uring_available() -> bool:
    return bool(_module is not None and _module.io_uring_available())


def io_run(path: str, write: bool, bs: int, size: int, *, threads: int = 1, qd: int = 1, direct: bool = False,
           random_order: bool = False, fsync: bool = True, engine: str = "auto", seed: int = 1) -> dict[str, Any]:
    """Move `size` bytes of an existing file in `bs` blocks; raises OSError (errno set) on failure.

    Returns bytes, seconds, iops, ios, lat_{p50,p99,p999,max,mean}_us, engine, workers.
    """
    if _module is not None:
        return _module.io_run(path, write, bs, size, threads=threads, qd=qd, direct=direct, random=random_order,
                              fsync=fsync, engine=engine, seed=seed)
    from .fallback import io_run as python_io_run

    return python_io_run(path, write, bs, size, threads=threads, qd=qd, direct=direct, random_order=random_order,
                         fsync=fsync, seed=seed)


def tcp_link(socks: list[socket.socket], role: int, mode: int, size: int, iters: int,
             timeout_s: float) -> list[float]:
    """Seconds per iteration over connected non-blocking sockets (the link probe's and hunt's
    loop); native when built, else targets/fallback.py's."""
    if _module is not None:
        return list(_module.tcp_link([s.fileno() for s in socks], role, mode, size, iters, timeout_s))
    from .fallback import tcp_link as python_tcp_link

    return python_tcp_link(socks, role, mode, size, iters, timeout_s)
