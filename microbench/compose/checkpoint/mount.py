"""A bucket mount as a checkpoint tier: how long training is blocked, how long until the bucket
holds the checkpoint, and whether the upload keeps up with the checkpoint interval.

A direct mount streams to the bucket: the save blocks for bytes / write and is then durable. A
cached mount blocks for bytes / write (its local cache disk), then uploads `write_back_s` after
close at the drain (bucket) bandwidth: durable = blocked + write_back + bytes / drain. The drain
only has to finish before the next checkpoint starts ("just fast enough"); if it cannot, the
backlog, and so the cache, grows every interval by what the drain could not move in it.

Pure functions: no probe, world or I/O. `--tier NAME=WRITE:READ,cached,drain=GB/S[,delay=5s]` or
a `storage mount` record describe the tier.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ...core.errors import UsageError
from ...core.units import parse_duration_s, parse_positive


@dataclass(frozen=True)
class MountTier:
    name: str
    write_gbps: float               # what the save sees: the cache disk (cached) or the bucket (direct)
    read_gbps: float | None
    cached: bool
    drain_gbps: float               # bucket bandwidth the upload gets (direct: = write_gbps)
    write_back_s: float = 0.0
    source: str = ""


def parse_options(text: str, name: str, write_gbps: float, read_gbps: float | None, options: str) -> MountTier:
    """The part of a --tier after WRITE[:READ]: `cached,drain=GB/S[,delay=DURATION]` or `direct`."""
    example = "--tier bucket=6:12,cached,drain=1.5"
    mode, drain, delay = None, None, 0.0
    for part in (p.strip() for p in options.split(",") if p.strip()):
        key, sep, value = part.partition("=")
        if not sep and key in ("cached", "direct"):
            mode = key
        elif key == "drain" and sep:
            drain = parse_positive(value, what=f"--tier {text!r} drain", example=example)
        elif key == "delay" and sep:
            delay = parse_duration_s(value, what=f"--tier {text!r} delay", example="5s")
        else:
            raise UsageError(f"invalid --tier {text!r}: unknown part {part!r}; expected cached or direct, drain=GB/S, "
                             f"delay=DURATION, e.g. {example}")
    if mode is None:
        raise UsageError(f"invalid --tier {text!r}: a mount tier says cached or direct, e.g. {example}")
    if mode == "cached" and drain is None:
        raise UsageError(f"invalid --tier {text!r}: a cached mount needs drain=GB/S (the bucket bandwidth its upload "
                         f"gets), e.g. {example}")
    if mode == "direct" and drain is not None:
        raise UsageError(f"invalid --tier {text!r}: a direct mount writes at the bucket's speed; drain= is for cached")
    return MountTier(name, write_gbps, read_gbps, mode == "cached", drain if drain is not None else write_gbps,
                     delay, f"--tier {text}")


def from_record(record: dict[str, Any], name: str, source: str) -> MountTier | None:
    """A `storage mount` record's cached rows (or else direct): blocked write bandwidth, and the
    drain bandwidth its durable time implies once the write-back delay is taken out."""
    if record.get("kind") != "storage_mount":
        return None
    rows = [r for r in record.get("rows", []) if r.get("op") == "write" and r.get("blocked_time_us")]
    cached = [r for r in rows if r.get("mode") == "cached"]
    row = (cached or rows or [None])[0]
    if row is None:
        return None
    size = float(row["size_bytes"])
    blocked_s = row["blocked_time_us"] / 1e6
    if row.get("mode") != "cached":
        return MountTier(name, size / blocked_s / 1e9, None, False, size / blocked_s / 1e9, 0.0, f"measured: {source}")
    delay = float((record.get("config") or {}).get("write_back_s") or 0.0)
    upload_s = max(row["durable_time_us"] / 1e6 - blocked_s - delay, 1e-9)
    return MountTier(name, size / blocked_s / 1e9, None, True, size / upload_s / 1e9, delay, f"measured: {source}")


@dataclass(frozen=True)
class MountPlan:
    tier: str
    cached: bool
    blocked_s: float                 # training waits this long per checkpoint
    durable_s: float                 # from the save's start until the bucket holds every byte
    interval_s: float
    overhead: float                  # blocked_s / interval_s
    drains_in_time: bool             # durable before the next checkpoint starts
    cache_growth_bytes_per_interval: float   # what the drain cannot move per interval (0 when it keeps up)
    min_interval_s: float            # the shortest interval with every checkpoint durable before the next
    least_bucket_gbps: float | None  # least bucket bandwidth meeting both the overhead and the drain; None: none does
    least_bucket_note: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def plan(tier: MountTier, ckpt_bytes: float, interval_s: float, max_overhead: float) -> MountPlan:
    if ckpt_bytes <= 0 or interval_s <= 0 or not 0 < max_overhead < 1:
        raise ValueError("checkpoint bytes and interval must be > 0 and the overhead in (0, 1)")
    blocked = ckpt_bytes / (tier.write_gbps * 1e9)
    upload = ckpt_bytes / (tier.drain_gbps * 1e9) if tier.cached else 0.0
    durable = blocked + (tier.write_back_s + upload if tier.cached else 0.0)
    # The upload runs back to back once behind: per interval it moves drain x interval bytes.
    growth = max(0.0, ckpt_bytes - tier.drain_gbps * 1e9 * interval_s) if tier.cached else 0.0
    least, note = _least_bucket(tier, ckpt_bytes, interval_s, max_overhead, blocked)
    return MountPlan(tier.name, tier.cached, blocked, durable, interval_s, blocked / interval_s, durable <= interval_s,
                     growth, durable, least, note)


def _least_bucket(tier: MountTier, ckpt_bytes: float, interval_s: float, max_overhead: float,
                  blocked: float) -> tuple[float | None, str]:
    """The least bucket GB/s with blocked <= overhead x interval and durable <= interval."""
    if not tier.cached:
        # Direct: the save itself is the upload; durable = blocked <= overhead x interval < interval.
        return ckpt_bytes / (max_overhead * interval_s) / 1e9, "direct: the save is the upload"
    if blocked > max_overhead * interval_s:
        return None, (f"the cache disk alone blocks {blocked / interval_s:.1%} of the interval, over the "
                      f"{max_overhead:.0%} allowed: no bucket bandwidth helps (a faster cache disk does)")
    window = interval_s - blocked - tier.write_back_s
    if window <= 0:
        return None, "the save plus the write-back delay already take the whole interval"
    return ckpt_bytes / window / 1e9, "cached: drain within the interval after the save and the write-back delay"


@dataclass(frozen=True)
class Period:
    """The job's own checkpoint period (--steps with --ckpt-every): `steps` steps of `train_s`
    seconds of training between saves, on the configuration named `on`."""
    steps: int
    train_s: float
    on: str


def report_lines(mounts: list[MountTier], ckpt_bytes: float, interval_s: float, max_overhead: float,
                 period: Period | None = None) -> list[str]:
    """The compose command's mount table: one row per tier that is a mount. With the job's own
    period, each save starts its training stretch plus its own blocked time after the last,
    instead of every --ckpt-interval."""
    from tabulate import tabulate

    from ..report import format_bytes, format_rate, format_time

    def interval(m: MountTier) -> float:
        return interval_s if period is None else period.train_s + ckpt_bytes / (m.write_gbps * 1e9)

    plans = [plan(m, ckpt_bytes, interval(m), max_overhead) for m in mounts]
    if not plans:
        return []
    rows: list[tuple[str, ...]]
    rows = [(p.tier, "cached" if p.cached else "direct", format_time(p.blocked_s), format_time(p.durable_s),
             f"{p.overhead:.1%}", "yes" if p.drains_in_time else
             f"no: cache grows {format_bytes(p.cache_growth_bytes_per_interval)}/interval"
             if p.cache_growth_bytes_per_interval > 0 else "no: durable after the next starts (no growth)",
             format_time(p.min_interval_s), format_rate(p.least_bucket_gbps) if p.least_bucket_gbps else "none")
            for p in plans]
    headers = ["mount tier", "mode", "blocked", "durable", "overhead", "drained before next", "shortest interval",
               "least bucket"]
    if period is not None:
        rows = [(*row[:2], format_time(p.interval_s), *row[2:]) for row, p in zip(rows, plans, strict=True)]
        headers = [*headers[:2], "interval", *headers[2:]]
        every = (f"every {period.steps} steps (--ckpt-every): {format_time(period.train_s)} of training on "
                 f"{period.on}, then the save")
    else:
        every = f"every {format_time(interval_s)}"
    table = tabulate(rows, headers=headers, tablefmt="simple", disable_numparse=True)
    notes = [f"# {p.tier}: least bucket: {p.least_bucket_note}" for p in plans]
    return [f"\n## bucket mounts: a checkpoint {every}, at most {max_overhead:.0%} blocked",
            table, *notes, "# durable = blocked + write-back delay + bytes / drain (cached); least bucket = the "
            "bandwidth keeping blocked time under --ckpt-overhead with each checkpoint durable before the next"]
