"""Storage tiers from saved storage records: the best sustained write and read bandwidth a
probe measured, whatever the probe (posix/fio rows read/write, S3 put/get, DCP save/load)."""

from __future__ import annotations

from typing import Any

from ...core import registry
from ...core.errors import UsageError

WRITE_OPS = ("write", "put", "save", "async_save")
READ_OPS = ("read", "get", "load")


def _bandwidth(row: dict[str, Any], record: dict[str, Any]) -> float | None:
    """The row's primary metric, as its probe's spec declares it (write_gbps for a write,
    throughput_gbps for a put)."""
    key = registry.row_metric(row, record)
    return float(row[key]) if key is not None else None


def tier_bandwidths(record: dict[str, Any], source: str = "") -> tuple[float, float | None]:
    """(write GB/s, read GB/s or None) over rows not flagged as served from memory."""
    write, read = 0.0, 0.0
    for row in record.get("rows", []):
        if row.get("served_from_memory") or row.get("above_memory_ceiling"):
            continue  # a page-cache number would make the tier look like RAM
        if row.get("stream") == "single":
            continue  # one writer, not what the job's ranks get together (tier_stream_gbps)
        value = _bandwidth(row, record)
        if value is None:
            continue
        if row.get("op") in WRITE_OPS:
            write = max(write, value)
        elif row.get("op") in READ_OPS:
            read = max(read, value)
    if write <= 0:
        raise UsageError(f"storage record {source!r} has no write/put/save rows with a bandwidth "
                         f"(kind {record.get('kind')!r}); run e.g. `microbench storage posix --rw write,read`")
    return write, (read or None)


def tier_stream_gbps(record: dict[str, Any]) -> float | None:
    """The single-stream write bandwidth a storage record measured (its row with stream
    "single": one buffered writer, fsync at the end, as torch.save writes), or None."""
    found = [_bandwidth(row, record) for row in record.get("rows", [])
             if row.get("stream") == "single" and row.get("op") in WRITE_OPS
             and not (row.get("served_from_memory") or row.get("above_memory_ceiling"))]
    found = [v for v in found if v]
    return max(found) if found else None
