"""Storage tiers from saved storage records: the best sustained write and read bandwidth a
probe measured, whatever the probe (posix/fio rows read/write, S3 put/get, DCP save/load), its
single stream, and a bucket mount's blocking and drain (a `storage mount` record)."""

from __future__ import annotations

from typing import Any

from ...core import registry
from ...core.errors import UsageError
from ...core.jsonfile import json_object
from ..checkpoint import mount as mount_tier
from ..curves import record_rows
from .tier import Tier

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
    rates = [v for v in found if v]
    return max(rates) if rates else None


def measured(record: dict[str, Any], name: str, path: str, *, allow_partial: bool = False) -> Tier:
    """The tier a storage or checkpoint record measured (`--storage [NAME=]RECORD`): its rows'
    aggregate as this run got it, named NAME or the record's kind."""
    record_rows(record, path)
    if record.get("status") != "complete" and not allow_partial:
        raise UsageError(f"--storage {path!r} is a {record.get('status')!r} record; re-run it, or pass --allow-partial")
    write, read = tier_bandwidths(record, path)
    name = name or str(record.get("kind"))
    mount = mount_tier.from_record(record, name, path)
    return Tier(name, write, read, f"measured: {path}", tier_stream_gbps(record), rated_only=False,
                aggregate_is_job=False, described=False, mount=mount,
                medium="mount" if mount is not None else _medium(record))


def _medium(record: dict[str, Any]) -> str:
    """s3 or directory, from where the record's probe wrote: an S3 endpoint or an s3:// target."""
    impl = json_object(record.get("implementation"))
    config = json_object(record.get("config"))
    probe = json_object(config.get("probe"))
    s3 = "endpoint" in impl or str(probe.get("target") or "").startswith("s3://")
    return "s3" if s3 else "directory"
