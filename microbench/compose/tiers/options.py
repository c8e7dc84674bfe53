"""A tier's durability and, for a cached bucket mount described without drain=, where its cache
lives (issue 23).

`--tier nvme=10:10,ephemeral`: a local disk that a restart on another node cannot read, so
checkpoints to it do not count as durable (the job what-if marks them and never recommends
them). Every other tier is durable unless it says `ephemeral`.

`--tier bucket=0.3:0.3,cached` (no drain=): WRITE:READ are the bucket's own rates, as for any
other tier, and the save writes to the mount's local cache first: at `cache=GB/S` when given,
else at the write rate of the fastest ephemeral tier given (the local disk such a cache lives
on); the drain to the bucket runs at WRITE. With drain= the older form keeps its meaning
(WRITE is the cache disk, drain= the bucket), so records and scripts read as before. Which
assumption ran is in the tier's `note`, printed under the tables.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from ..checkpoint import mount as mount_tier
from ...core.errors import UsageError

DURABILITY = ("ephemeral", "durable")


def split_durability(text: str, base: str) -> tuple[str, bool]:
    """(the tier text without ,ephemeral / ,durable, durable?)."""
    head, *options = base.split(",")
    marks = [o.strip() for o in options if o.strip() in DURABILITY]
    if len(marks) > 1:
        raise UsageError(f"invalid --tier {text!r}: give ephemeral or durable once, e.g. --tier nvme=10:10,ephemeral")
    rest = [o for o in options if o.strip() not in DURABILITY]
    return ",".join([head, *rest]), not (marks and marks[0] == "ephemeral")


def local_cache(tiers: list[dict[str, Any]]) -> tuple[float, str] | None:
    """(GB/s, name) of the fastest ephemeral tier's write: where a cached mount's cache lives."""
    local = [t for t in tiers if t.get("durable") is False and not t.get("mount")]
    if not local:
        return None
    best = max(local, key=lambda t: t["write_gbps"])
    return best["write_gbps"], best["tier"]


def attach_mount(tier: dict[str, Any], text: str, options: str, local: tuple[float, str] | None) -> None:
    """Parse a mount tier's options into tier["mount"]; a cached mount without drain= writes at its
    cache's rate (tier["write_gbps"] becomes what the save sees) and says so in tier["note"]."""
    parts = [p.strip() for p in options.split(",") if p.strip()]
    cache = [p.partition("=")[2] for p in parts if p.startswith("cache=")]
    rest = ",".join(p for p in parts if not p.startswith("cache="))
    bucket_write = tier["write_gbps"]
    if "cached" in parts and not any(p.startswith("drain=") for p in parts):
        if cache:
            from ...core.units import parse_positive
            gbps = parse_positive(cache[0], what=f"--tier {text!r} cache", example="--tier bucket=0.3:0.3,cached,cache=10")
            where = f"cache=GB/S given: {gbps:g} GB/s"
        elif local is not None:
            gbps, name = local
            where = f"the fastest ephemeral tier given, {name}'s write ({gbps:g} GB/s); cache=GB/S to state it"
        else:
            raise UsageError(f"invalid --tier {text!r}: a cached mount needs drain=GB/S (the bucket bandwidth its "
                             f"upload gets) with WRITE its cache disk, or cache=GB/S, or an ephemeral local tier to "
                             f"cache on, e.g. --tier bucket=0.3:0.3,cached,cache=10 or --tier nvme=10:10,ephemeral")
        m = mount_tier.parse_options(text, tier["tier"], gbps, tier["read_gbps"], f"{rest},drain={bucket_write}")
        tier["write_gbps"] = gbps
        tier["note"] = (f"{tier['tier']}: cached mount: {bucket_write:g}:{tier['read_gbps'] or '-'} taken as the "
                        f"bucket's write:read (the drain); the save blocks on the cache write at {where}")
    elif cache:
        raise UsageError(f"invalid --tier {text!r}: cache= is for a cached mount without drain=, e.g. "
                         f"--tier bucket=0.3:0.3,cached,cache=10")
    else:
        m = mount_tier.parse_options(text, tier["tier"], bucket_write, tier["read_gbps"], rest)
    tier["mount"] = asdict(m)
