"""Reading the dataset as a trainer does: torch.utils.data.DataLoader over a map-style dataset
(files: one read per sample, shuffled; over several ranks each reads the share
DistributedSampler deals it) or an iterable one (shards: the rank's shards split across the
loader's workers, each shard streamed member by member). Every sample is checked in the worker
that read it, right after its read, where a trainer would decode it; `decode_us` adds that
decode's CPU time per sample.

One pass is timed from creating the iterator (workers start then, as they do at each epoch) to
the last batch; `first_batch_s` is the wait for the first one, `batch_wait_us` every wait the
training loop would see in `next()`.
"""

from __future__ import annotations

import functools
import os
import time
from dataclasses import dataclass, field
from typing import Any

from . import dataset as ds

PR_SET_PDEATHSIG = 1   # <linux/prctl.h>


@dataclass
class Source:
    """Where the bytes are: a local directory, or an S3 bucket and prefix. S3 clients are made
    per process (DataLoader workers are forks), lazily, as a streaming loader's are. A local
    files dataset's paths are listed once (`index`), as an image folder's dataset lists its
    files when it is made, not at every epoch."""

    root: str | None = None
    bucket: str | None = None
    prefix: str = ""
    s3: Any = None                      # s3client.Target
    paths: list[str] | None = field(default=None, repr=False)
    _clients: dict[int, Any] = field(default_factory=dict, repr=False)

    @property
    def is_s3(self) -> bool:
        return self.bucket is not None

    def index(self, plan: ds.Plan) -> "Source":
        """List a local files dataset's paths now, outside any timed pass."""
        if plan.layout == "files" and not self.is_s3 and self.paths is None:
            self.paths = [self._local(key) for key in plan.keys()]
        return self

    def client(self) -> Any:
        pid = os.getpid()
        if pid not in self._clients:
            self._clients[pid] = self.s3.client(pool=4)
        return self._clients[pid]

    def read_file(self, index: int) -> Any:
        """A sample's bytes where no path list was made (S3, or a directory not indexed)."""
        if self.is_s3:
            body = self.client().get_object(Bucket=self.bucket, Key=f"{self.prefix}/{ds.file_key(index)}")["Body"]
            return body.read()
        with open(self._local(ds.file_key(index)), "rb") as handle:
            return handle.read()

    def open_shard(self, key: str) -> Any:
        if self.is_s3:
            return self.client().get_object(Bucket=self.bucket, Key=f"{self.prefix}/{key}")["Body"]
        return open(self._local(key), "rb")

    def _local(self, key: str) -> str:
        assert self.root is not None   # not S3: a directory
        return os.path.join(self.root, key)


class Flagged(tuple):
    """(data, wrong, requests) for a sample that failed its check or carries a GET (an S3
    file, a shard's first sample on S3); every other sample travels as its bytes alone, as a
    bare loop's do, so the hand-off and the collate cost no tuple a sample."""


def _decode(us: float) -> None:
    """A decode's CPU time: the worker is busy, as with a JPEG decode or tokenization."""
    if us > 0:
        end = time.perf_counter() + us / 1e6
        while time.perf_counter() < end:
            pass


def datasets(torch: Any) -> tuple[type, type]:
    """The two dataset classes, made once torch is imported (this module loads without it)."""
    from torch.utils.data import Dataset, IterableDataset

    class FileSamples(Dataset):
        def __init__(self, source: Source, plan: ds.Plan, decode_us: float):
            self.source, self.plan, self.decode_us = source, plan, decode_us
            self.paths = source.paths   # listed once (Source.index): an open and a read a sample
            self.check, self.check_args = ds.sample_check(plan)
            self.requests = 1 if source.is_s3 else 0   # a GET a sample

        def __len__(self) -> int:
            return self.plan.samples

        def __getitem__(self, index: int) -> Flagged | bytes:
            if self.paths is not None:
                with open(self.paths[index], "rb") as handle:
                    data = handle.read()
            else:
                data = self.source.read_file(index)
            bad = self.check(index, data, *self.check_args)
            if self.decode_us:
                _decode(self.decode_us)
            return Flagged((data, bad, self.requests)) if bad or self.requests else data

    class ShardSamples(IterableDataset):
        def __init__(self, source: Source, plan: ds.Plan, decode_us: float, rank: int, ranks: int):
            self.source, self.plan, self.decode_us = source, plan, decode_us
            self.mine = list(range(len(plan.shards)))[rank::ranks]   # the rank's shards

        def __iter__(self) -> Any:
            info = torch.utils.data.get_worker_info()
            shards = self.mine if info is None else self.mine[info.id::info.num_workers]
            check, (low, high, base, span, stride) = ds.sample_check(self.plan)
            for shard in shards:
                stream = self.source.open_shard(self.plan.shard_key(shard))
                requests = 1 if self.source.is_s3 else 0
                try:
                    for name, data in ds.tar_members(stream):
                        bad = check(name, data, low, high, base, span, stride)
                        if self.decode_us:
                            _decode(self.decode_us)
                        yield Flagged((data, bad, requests)) if bad or requests else data
                        requests = 0   # the shard's one GET, counted with its first sample
                finally:
                    stream.close()

    return FileSamples, ShardSamples


def collate(batch: list) -> tuple:
    """A batch as the training loop receives it: the samples' bytes as read (a list, as a bare
    loop's `collate_fn=list` hands them over, through the worker's pipe), with how many of them
    were wrong (each checked in the worker right after its read), the GETs and the bytes."""
    flagged = [item for item in batch if type(item) is Flagged]
    if not flagged:
        return batch, 0, 0, sum(map(len, batch))
    datas = [item[0] if type(item) is Flagged else item for item in batch]
    return datas, sum(f[1] for f in flagged), sum(f[2] for f in flagged), sum(map(len, datas))


def as_tensor(datas: list, pin: bool) -> Any:
    """The batch as the model takes it on a GPU host: one [batch, size] uint8 tensor (flat when
    the samples' sizes differ), pinned for the copy to the device as a trainer's loop pins it.
    One copy of the bytes; the CPU pass hands the bytes on as they are, as the bare loop does."""
    import torch

    data = bytearray().join(datas)
    out = torch.frombuffer(data, dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
    if datas and all(len(d) == len(datas[0]) for d in datas):
        out = out.view(len(datas), -1)
    return out.pin_memory() if pin else out


@dataclass
class PassResult:
    time_s: float
    first_batch_s: float
    waits_s: list[float]
    samples: int
    bytes: int
    wrong: int
    requests: int


def loader(source: Source, plan: ds.Plan, *, workers: int, batch_size: int, prefetch_factor: int,
           decode_us: float, rank: int, ranks: int, pin_memory: bool, epoch: int) -> Any:
    import warnings

    import torch
    from torch.utils.data import DataLoader, DistributedSampler

    # More workers than cores is what the sweep asks for on purpose (a trainer's setting measured
    # as it would run here); the report says it once instead of torch warning on every pass.
    warnings.filterwarnings("ignore", message=r"This DataLoader will create \d+ worker processes",
                            category=UserWarning)
    files, shards = datasets(torch)
    extra: dict[str, Any] = {"prefetch_factor": prefetch_factor,
                             "worker_init_fn": functools.partial(die_with_parent, os.getpid())} if workers > 0 else {}
    if plan.layout == "files":
        data = files(source, plan, decode_us)
        if ranks == 1:
            # One process shuffles with a seeded RandomSampler, as a trainer's
            # `shuffle=sampler is None` does: DistributedSampler's list cost 0.5 us a sample more.
            order = torch.Generator().manual_seed(ds.SEED + epoch)
            return DataLoader(data, batch_size=batch_size, shuffle=True, generator=order, num_workers=workers,
                              collate_fn=collate, **extra)
        sampler: DistributedSampler[int] = DistributedSampler(data, num_replicas=ranks, rank=rank, shuffle=True,
                                                              seed=ds.SEED, drop_last=False)
        sampler.set_epoch(epoch)
        return DataLoader(
            data, batch_size=batch_size, sampler=sampler, num_workers=workers, collate_fn=collate, **extra
        )
    data = shards(source, plan, decode_us, rank, ranks)
    return DataLoader(data, batch_size=batch_size, num_workers=workers, collate_fn=collate, **extra)


def die_with_parent(parent: int, _worker_id: int) -> None:
    """A DataLoader worker ends with the rank that started it (the kernel's parent-death signal).
    torch's watchdog looks for a dead parent only between fetches: a worker blocked handing a
    batch to a rank that was killed or stopped (its queue full, nobody reading) outlived it for
    good, holding the caller's stdout and stderr open, so a wrapper reading them hung."""
    import ctypes
    import signal

    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        return   # not Linux: torch's own watchdog is all there is
    if os.getppid() != parent:   # the rank died before the signal was asked for
        os._exit(1)


def one_pass(make: Any, pin: bool = False) -> PassResult:
    """Iterate one loader to the end, as a training loop's `for batch in loader` does."""
    start = time.perf_counter()
    it = iter(make())
    waits: list[float] = []
    samples = nbytes = bad = requests = 0
    first = None
    try:
        while True:
            t0 = time.perf_counter()
            try:
                datas, wrong, reqs, size = next(it)
            except StopIteration:
                break
            if pin:
                as_tensor(datas, pin)
            now = time.perf_counter()
            waits.append(now - t0)
            if first is None:
                first = now - start
            samples += len(datas)
            nbytes += size
            bad += wrong
            requests += reqs
        elapsed = time.perf_counter() - start
    finally:
        del it   # shuts the workers down (untimed)
    return PassResult(elapsed, first or 0.0, waits, samples, nbytes, bad, requests)
