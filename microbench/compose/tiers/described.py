"""A tier described on the command line: `--tier NAME=WRITE[:READ][,OPTION...]`, WRITE and READ the
aggregate GB/s the job gets (a number, or a rate with its unit). Options:

  stream=GB/S   one writer's rate (what a full state dict's torch.save gets);
  ephemeral     a node-local disk a restart on another node cannot read: checkpoints to it are
                not durable (the job what-if marks them and never recommends them); `durable`,
                the default, may be said too;
  cached | direct, drain=GB/S, delay=DURATION, cache=GB/S
                a bucket mount (compose/checkpoint/mount.py). With drain=, WRITE is the cache
                disk and drain= the bucket (records and scripts written so read as before).
                `cached` without drain=: WRITE:READ are the bucket's own rates, as for any other
                tier, and the save writes to the mount's local cache first, at cache=GB/S when
                given, else at the write rate of the fastest ephemeral tier given (the local
                disk such a cache lives on); the drain to the bucket runs at WRITE. Which
                assumption ran is the tier's note, printed under the tables.

Each --tier is read alone when argv is parsed (parse); a cached mount's cache needs every tier
given, so the mounts are resolved together (resolve).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from ...core.errors import UsageError
from ...core.units import parse_bandwidth_bytes_per_s, parse_positive
from ..checkpoint import mount as mount_tier
from .tier import Tier

DURABILITY = ("ephemeral", "durable")
EXAMPLE = "nvme=6:12"


@dataclass(frozen=True)
class DescribedTier:
    """One --tier as typed, its numbers parsed; the mount options wait for resolve()."""
    text: str
    name: str
    write_gbps: float
    read_gbps: float | None
    stream_gbps: float | None
    durable: bool
    mount_options: str        # "" when it is not a mount


def rate_gbps(text: str, rate: str, which: str) -> float:
    """GB/s from a bare number (GB/s) or a rate with its unit (1.6GB/s, 10gbit)."""
    try:
        if re.search(r"[a-zA-Z/]", rate) and not re.fullmatch(r"\s*[0-9.eE+-]+\s*", rate):
            return parse_bandwidth_bytes_per_s(rate, what="--tier") / 1e9
        return parse_positive(rate, what="--tier", example=EXAMPLE)
    except UsageError:
        raise UsageError(f"invalid --tier {text!r}: the {which} bandwidth {rate!r} must be a positive finite "
                         f"number of GB/s, e.g. --tier {EXAMPLE}") from None


def split_stream(text: str) -> tuple[str, str | None]:
    """'nvme=10:10,stream=2' -> ('nvme=10:10', '2'): the single-stream rate a --tier may carry
    among its comma options; the others (a mount's ,cached,drain=) stay in the text."""
    head, *options = str(text).split(",")
    streams = [o.partition("=")[2].strip() for o in options if o.strip().startswith("stream=")]
    if len(streams) > 1 or (streams and not streams[0]):
        raise UsageError(f"invalid --tier {text!r}: one stream=GB/S at most, e.g. --tier nvme=10:10,stream=2")
    rest = [o for o in options if not o.strip().startswith("stream=")]
    return ",".join([head, *rest]), (streams[0] if streams else None)


def split_durability(text: str, base: str) -> tuple[str, bool]:
    """(the tier text without ,ephemeral / ,durable, durable?)."""
    head, *options = base.split(",")
    marks = [o.strip() for o in options if o.strip() in DURABILITY]
    if len(marks) > 1:
        raise UsageError(f"invalid --tier {text!r}: give ephemeral or durable once, e.g. --tier nvme=10:10,ephemeral")
    rest = [o for o in options if o.strip() not in DURABILITY]
    return ",".join([head, *rest]), not (marks and marks[0] == "ephemeral")


def parse(text: str, flag: str = "--tier") -> DescribedTier:
    """One --tier, read when argv is parsed."""
    base, stream = split_stream(text)
    base, durable = split_durability(text, base)
    name, _, rates = base.partition("=")
    rates, _, mount_options = rates.partition(",")
    write, _, read = rates.partition(":")
    if not name or not write:
        raise UsageError(f"invalid --tier {text!r}: expected NAME=WRITE_GBPS[:READ_GBPS][,stream=GB/S], e.g. {EXAMPLE}")
    return DescribedTier(text, name, rate_gbps(text, write, "write"), rate_gbps(text, read, "read") if read else None,
                         rate_gbps(text, stream, "single-stream") if stream else None, durable, mount_options)


def resolve(given: list[DescribedTier]) -> list[Tier]:
    """The tiers, with each mount's options read and a cached mount without drain= placed on its
    cache (cache=GB/S, or the fastest ephemeral tier given)."""
    tiers = [Tier(d.name, d.write_gbps, d.read_gbps, f"--tier {d.text}", d.stream_gbps,
                  rated_only=d.stream_gbps is None and not d.mount_options, durable=d.durable,
                  medium="mount" if d.mount_options else "") for d in given]
    local = local_cache(tiers)
    return [
        attach_mount(t, d.text, d.mount_options, local) if d.mount_options else t
        for t, d in zip(tiers, given, strict=True)
    ]


def local_cache(tiers: list[Tier]) -> tuple[float, str] | None:
    """(GB/s, name) of the fastest ephemeral tier's write: where a cached mount's cache lives."""
    local = [t for t in tiers if not t.durable and t.medium != "mount"]
    if not local:
        return None
    best = max(local, key=lambda t: t.write_gbps)
    return best.write_gbps, best.name


def attach_mount(tier: Tier, text: str, options: str, local: tuple[float, str] | None) -> Tier:
    """The tier with its mount; a cached mount without drain= writes at its cache's rate (the
    tier's write_gbps becomes what the save sees) and says so in its note."""
    parts = [p.strip() for p in options.split(",") if p.strip()]
    cache = [p.partition("=")[2] for p in parts if p.startswith("cache=")]
    rest = ",".join(p for p in parts if not p.startswith("cache="))
    bucket_write = tier.write_gbps
    if "cached" in parts and not any(p.startswith("drain=") for p in parts):
        if cache:
            gbps = parse_positive(
                cache[0], what=f"--tier {text!r} cache", example="--tier bucket=0.3:0.3,cached,cache=10"
            )
            where = f"cache=GB/S given: {gbps:g} GB/s"
        elif local is not None:
            gbps, name = local
            where = f"the fastest ephemeral tier given, {name}'s write ({gbps:g} GB/s); cache=GB/S to state it"
        else:
            raise UsageError(f"invalid --tier {text!r}: a cached mount needs drain=GB/S (the bucket bandwidth its "
                             f"upload gets) with WRITE its cache disk, or cache=GB/S, or an ephemeral local tier to "
                             f"cache on, e.g. --tier bucket=0.3:0.3,cached,cache=10 or --tier nvme=10:10,ephemeral")
        m = mount_tier.parse_options(text, tier.name, gbps, tier.read_gbps, f"{rest},drain={bucket_write}")
        note = (f"{tier.name}: cached mount: {bucket_write:g}:{tier.read_gbps or '-'} taken as the bucket's "
                f"write:read (the drain); the save blocks on the cache write at {where}")
        return replace(tier, write_gbps=gbps, note=note, mount=m)
    if cache:
        raise UsageError(f"invalid --tier {text!r}: cache= is for a cached mount without drain=, e.g. "
                         f"--tier bucket=0.3:0.3,cached,cache=10")
    return replace(tier, mount=mount_tier.parse_options(text, tier.name, bucket_write, tier.read_gbps, rest))
