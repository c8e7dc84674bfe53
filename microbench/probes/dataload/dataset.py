"""The synthetic dataset dataload reads: what every sample holds (so each one read can be
checked), how samples are laid out (one file per sample in a directory tree, as an image
folder; or WebDataset tar shards of `key.ext` members), and writing it to a directory or an S3
prefix. Pure Python apart from the S3 client; no torch here.

A sample's bytes are a function of its index alone, so a worker in another process (or on another
rank) checks what it read without any table: the index's 8 little-endian bytes, then a slice of
one seeded random buffer whose start moves with the index. A sample read under the wrong name,
truncated, or from the wrong place in a shard fails the check.
"""

from __future__ import annotations

import io
import math
import os
import random
import tarfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Iterator

SEED = 20240521
SPAN = 65536                 # sample starts move through this many bytes of the random buffer
STRIDE = 4099                # prime: neighbouring samples start far apart
HEADER = 8
EXT = "bin"                  # the one member extension (WebDataset groups members by key)
FILES_PER_DIR = 1000         # an image folder's class directories
TAR_BLOCK = 512


def sample_size(index: int, low: int, high: int) -> int:
    """Bytes of sample `index`: fixed when low == high, else spread over [low, high] by a
    multiplicative hash, the same in every process."""
    if low == high:
        return low
    return low + (index * 2654435761) % (high - low + 1)


_BASE: dict[int, bytes] = {}


def base_buffer(high: int) -> bytes:
    """The seeded random bytes samples are cut from (made once per process)."""
    if high not in _BASE:
        _BASE[high] = random.Random(SEED).randbytes(SPAN + high)
    return _BASE[high]


def sample_bytes(index: int, size: int, high: int) -> bytes:
    head = index.to_bytes(HEADER, "little")[:size]
    start = (index * STRIDE) % SPAN + len(head)
    return head + base_buffer(high)[start:start + size - len(head)]


def wrong(index: int, data: Any, high: int, size: int) -> int:
    """1 when `data` is not sample `index`'s bytes, else 0. bytes.startswith at an offset is one
    memcmp with no copy (a memoryview ==, element by element, cost 3.5 us per KiB)."""
    if len(data) != size:
        return 1
    head = min(HEADER, size)
    view = memoryview(data)
    if view[:head] != index.to_bytes(HEADER, "little")[:head]:
        return 1
    return int(not base_buffer(high).startswith(view[head:], (index * STRIDE) % SPAN + head))


def sample_check(plan: "Plan") -> tuple[Any, tuple]:
    """(check, args): `check(key, data, *args)` is 1 when `data` is not the bytes of the sample
    `key` names (an index, or a member name as `member_index` reads it), else 0. Native
    (native/sample_check.c) when the core is built: one memcmp while the bytes just read are
    still in the core's cache. In Python the check cost about 1.4 us a sample, 4 % of a 16K tar
    sample's whole read on the 2-core VM, which the probe would have reported as the loader's."""
    from ...targets import native

    args = (plan.low, plan.high, base_buffer(plan.high), SPAN, STRIDE)
    module = native.module()
    return (module.check_sample if module is not None else check_sample), args


def check_sample(key: Any, data: Any, low: int, high: int, base: bytes, span: int, stride: int) -> int:
    """The Python twin of native check_sample (the fallback); `base` is base_buffer(high)."""
    index = key if isinstance(key, int) else member_index(key)
    if index < 0:
        return 1
    return wrong(index, data, high, sample_size(index, low, high))


def member_name(index: int) -> str:
    return f"{index:08d}.{EXT}"


def member_index(name: str) -> int:
    """The digits after the last '/' up to the first '.', or -1 (as native/sample_check.c reads them)."""
    digits = name.rsplit("/", 1)[-1].split(".", 1)[0]
    return int(digits) if digits.isascii() and digits.isdigit() and len(digits) <= 18 else -1


def file_key(index: int) -> str:
    return f"files/{index // FILES_PER_DIR:05d}/{member_name(index)}"


def tar_bytes(size: int) -> int:
    """Bytes one member takes in a tar: a header block and the data rounded up to blocks."""
    return TAR_BLOCK + -(-size // TAR_BLOCK) * TAR_BLOCK


@dataclass(frozen=True)
class Plan:
    """Which samples exist and where: the layout, the sizes, and for shards which samples each
    shard holds (contiguous index ranges)."""

    layout: str
    samples: int
    low: int
    high: int
    shards: tuple[tuple[int, int], ...] = ()   # (first index, end index) per shard

    def size(self, index: int) -> int:
        return sample_size(index, self.low, self.high)

    @property
    def total_bytes(self) -> int:
        if self.low == self.high:
            return self.samples * self.low
        return sum(self.size(i) for i in range(self.samples))

    def shard_key(self, shard: int) -> str:
        return f"shards/shard-{shard:06d}.tar"

    def keys(self) -> list[str]:
        if self.layout == "files":
            return [file_key(i) for i in range(self.samples)]
        return [self.shard_key(k) for k in range(len(self.shards))]

    def disk_bytes(self, block: int = 4096) -> int:
        """What the dataset takes on a filesystem: each file rounded up to `block`; a shard's
        tar headers, padding and end-of-archive blocks. Over a million samples of a size range,
        estimated from the largest size (a bound, at once)."""
        fixed = self.low == self.high or self.samples > 1_000_000
        if self.layout == "files":
            per = lambda i: -(-self.size(i) // block) * block
        else:
            per = lambda i: tar_bytes(self.size(i))
        total = self.samples * (per(0) if self.low == self.high else
                                -(-self.high // block) * block if self.layout == "files" else tar_bytes(self.high)) \
            if fixed else sum(per(i) for i in range(self.samples))
        return total + len(self.shards) * 20 * TAR_BLOCK   # end blocks and record padding

    @property
    def shard_bytes(self) -> int:
        """The largest shard's data bytes."""
        if not self.shards:
            return 0
        return max(sum(tar_bytes(self.size(i)) for i in range(a, b)) for a, b in self.shards)


def plan(layout: str, samples: int, low: int, high: int, shard_size: int, min_shards: int) -> Plan:
    """Shards of at most `shard_size`, and at least `min_shards` of them (as many as there are
    samples at most) so every worker of every rank gets some: a small dataset gets smaller shards."""
    if layout == "files":
        return Plan(layout, samples, low, high)
    average = (low + high) / 2
    count = max(math.ceil(samples * tar_bytes(int(average)) / shard_size), min(samples, min_shards), 1)
    per = math.ceil(samples / count)
    shards = tuple((a, min(a + per, samples)) for a in range(0, samples, per))
    return Plan(layout, samples, low, high, shards)


def plan_for(config: Any) -> Plan:
    """The plan of a dataload Config: at least 4 shards per worker of every rank."""
    low, high = config.sample_size
    min_shards = 4 * config.ranks * max(1, max(config.workers))
    return plan(config.layout, config.samples, low, high, config.shard_size, min_shards)


def shard_tar(p: Plan, shard: int) -> bytes:
    """One WebDataset shard: its samples as `key.ext` members, in index order."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        first, end = p.shards[shard]
        for i in range(first, end):
            data = sample_bytes(i, p.size(i), p.high)
            info = tarfile.TarInfo(member_name(i))
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def write_local(p: Plan, root: str) -> list[str]:
    """Write the dataset under `root`; the paths written, then synced (so a page-cache drop can
    evict them: dirty pages are not dropped)."""
    paths = []
    if p.layout == "files":
        for i in range(p.samples):
            path = os.path.join(root, file_key(i))
            if i % FILES_PER_DIR == 0:
                os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "xb") as handle:
                handle.write(sample_bytes(i, p.size(i), p.high))
            paths.append(path)
    else:
        os.makedirs(os.path.join(root, "shards"), exist_ok=True)
        for k in range(len(p.shards)):
            path = os.path.join(root, p.shard_key(k))
            with open(path, "xb") as handle:
                handle.write(shard_tar(p, k))
            paths.append(path)
    os.sync()
    return paths


def write_s3(p: Plan, client: Any, bucket: str, prefix: str, threads: int = 8) -> int:
    """PUT every object under `prefix/`; returns the number of objects."""
    def put(k: int) -> None:
        if p.layout == "files":
            client.put_object(Bucket=bucket, Key=f"{prefix}/{file_key(k)}", Body=sample_bytes(k, p.size(k), p.high))
        else:
            client.put_object(Bucket=bucket, Key=f"{prefix}/{p.shard_key(k)}", Body=shard_tar(p, k))

    count = p.samples if p.layout == "files" else len(p.shards)
    # Shards are held whole in memory while they upload: fewer threads for them.
    with ThreadPoolExecutor(max_workers=threads if p.layout == "files" else 2) as pool:
        for _ in pool.map(put, range(count)):
            pass
    return count


def tar_members(stream: Any) -> Iterator[tuple[str, bytes]]:
    """(name, bytes) for every file member of a tar read as a stream (mode "r|"), as
    WebDataset's tar iterator reads a shard from a file or an HTTP/S3 body."""
    with tarfile.open(fileobj=stream, mode="r|") as tar:
        for info in tar:
            if info.isfile():
                member = tar.extractfile(info)
                assert member is not None   # a regular file's entry always has its contents
                yield info.name, member.read()
