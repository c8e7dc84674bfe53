"""fio as an engine: its command line for the native engine's workload, its JSON, its version.

The same file workload through fio (a subprocess), for a second opinion on the native engine.

fio gets the same file, block size, slices and concurrency: numjobs = threads, each job one
slice (offset_increment) with iodepth = qd on io_uring; or, when the native engine runs
synchronous workers, numjobs = threads x qd on psync. Writes end with fsync (end_fsync=1),
reads start with the file's pages invalidated. Bandwidth is fio's own bytes / its runtime, so
fio's start-up and layout never count. fio can print warnings before its JSON: the parser looks
for the JSON document wherever it starts.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from typing import Any

from ...core.errors import ProbeUnavailable, RunError
from ...core.units import format_size


def fio_binary() -> str | None:
    return shutil.which("fio")


def fio_unavailable_reason() -> str | None:
    if fio_binary() is None:
        return (
            "fio is not installed (e.g. apt-get install fio); the native engine still works: microbench storage posix"
        )
    return None


def fio_version() -> str | None:
    exe = fio_binary()
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


def fio_args(path: str, *, write: bool, bs: int, size: int, threads: int, qd: int, direct: bool,
             random_order: bool, engine: str) -> list[str]:
    uring = engine == "io_uring"
    jobs = threads if uring else threads * qd
    slice_bytes = size // jobs // bs * bs
    rw = ("rand" if random_order else "") + ("write" if write else "read")
    args = [f"--name=microbench-{rw}", f"--filename={path}", f"--rw={rw}", f"--bs={bs}", f"--size={slice_bytes}",
            f"--offset_increment={slice_bytes}", f"--numjobs={jobs}", f"--iodepth={qd if uring else 1}",
            f"--ioengine={'io_uring' if uring else 'psync'}", f"--direct={int(direct)}", "--thread",
            "--group_reporting", "--output-format=json", "--invalidate=1", "--lat_percentiles=1",
            "--percentile_list=50:99:99.9", "--randrepeat=0", "--allow_file_create=0", "--fallocate=none",
            "--overwrite=1" if write else "--overwrite=0"]
    if write:
        args.append("--end_fsync=1")
    return args


def parse_fio_json(text: str) -> dict[str, Any]:
    """The JSON document in fio's stdout, skipping any warning lines printed before it."""
    decoder = json.JSONDecoder()
    start = 0
    while True:
        start = text.find("{", start)
        if start < 0:
            raise RunError(f"fio printed no JSON result (output began: {text.strip()[:120]!r})")
        try:
            doc, _ = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            start += 1
            continue
        if isinstance(doc, dict) and "jobs" in doc:
            return doc
        start += 1


def _percentile(lat: dict[str, Any], key: str) -> float | None:
    pct = lat.get("percentile") or {}
    for name, value in pct.items():
        if abs(float(name) - float(key)) < 1e-9:
            return value / 1e3
    return None


def summarize_fio(doc: dict[str, Any], write: bool) -> dict[str, Any]:
    jobs = doc.get("jobs") or []
    if not jobs:
        raise RunError("fio's JSON has no jobs")
    job = jobs[0]
    if job.get("error"):
        raise RunError(f"fio job failed with error {job['error']}: {job.get('error_msg', '')}".strip())
    side = job["write" if write else "read"]
    io_bytes, bw = int(side.get("io_bytes", 0)), float(side.get("bw_bytes", 0))
    if io_bytes <= 0 or bw <= 0:
        raise RunError(f"fio moved no bytes ({'write' if write else 'read'} io_bytes={io_bytes})")
    lat = side.get("lat_ns") if (side.get("lat_ns") or {}).get("percentile") else side.get("clat_ns", {})
    return {"bytes": io_bytes, "seconds": io_bytes / bw, "iops": float(side.get("iops", 0.0)),
            "lat_p50_us": _percentile(lat, "50"), "lat_p99_us": _percentile(lat, "99"),
            "lat_p999_us": _percentile(lat, "99.9"), "lat_max_us": float(lat.get("max", 0)) / 1e3,
            "engine": f"fio {job.get('job options', {}).get('ioengine', '')}".strip()}


def run_fio(path: str, *, write: bool, bs: int, size: int, threads: int, qd: int, direct: bool,
            random_order: bool, engine: str, timeout_s: float = 3600) -> dict[str, Any]:
    exe = fio_binary()
    if exe is None:
        raise ProbeUnavailable(fio_unavailable_reason() or "fio is not installed")
    args = fio_args(path, write=write, bs=bs, size=size, threads=threads, qd=qd, direct=direct,
                    random_order=random_order, engine=engine)
    try:
        out = subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise RunError(f"fio did not finish within {timeout_s:.0f} s ({'write' if write else 'read'} "
                       f"{format_size(bs)} blocks)") from None
    if out.returncode != 0:
        lines = [
            ln
            for ln in (out.stderr + "\n" + out.stdout).splitlines()
            if ln.strip() and not ln.startswith((" ", "{", "}"))
        ]
        detail = lines[-1].strip() if lines else f"exit status {out.returncode}"
        if "No space left" in detail:
            raise RunError(
                "fio write failed: no space left on device (ENOSPC); free some space or use a smaller --size"
            )
        raise RunError(f"fio failed ({'write' if write else 'read'} {format_size(bs)} blocks): {detail[:200]}")
    return summarize_fio(parse_fio_json(out.stdout), write)
