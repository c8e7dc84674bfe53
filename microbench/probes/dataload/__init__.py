"""Streaming training batches: a synthetic dataset read through torch.utils.data.DataLoader.

The dataset (dataset.py) is written once, in one of the layouts people train from: one file
per sample in a directory tree (`--layout files`, an image folder) or WebDataset tar shards
(`--layout shards`), on a directory (`--path`, any mount) or an S3 prefix (`--target s3://`, the
embedded server unless `--endpoint`). Each case is one `--workers` count; one iteration is one
pass over the dataset after its cached pages were dropped (loader.py): every rank reads its
share (files shuffled, by DistributedSampler over several ranks; shards dealt to ranks and then
to workers) and every sample's bytes are checked.

samples_per_s = samples read by all ranks / the slowest rank's pass time; read_gbps = their
bytes / that time (1e9 B/s). first_batch_s and batch_wait_us_p50/p99 (the waits in `next()`
a training loop sees) are the slowest rank's; s3_requests counts every GET of the pass.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, replace
from typing import Any

from ...core.errors import UsageError
from ...core.options import choice, nbytes, nonneg_int, option, positive_int, timeout
from ...core.probe import Case, Probe, Timed
from ...core.registry import Needs, ProbeSpec, SuiteStep, SweepDefaults
from ...core.units import format_bytes_human, format_size, format_size_exact, parse_number, parse_size
from ...results.schema import ProbeRow
from ...world.dist import World
from . import dataset as ds
from .run import print_report, run

LAYOUTS = ("shards", "files")


def size_or_range(text: Any, flag: str) -> list[int]:
    """`16K` (every sample that size) or `8K-64K` (sizes spread over the range)."""
    raw = str(text).strip()
    low_text, sep, high_text = raw.partition("-")
    low = parse_size(low_text, what=flag, typed=raw)
    high = parse_size(high_text, what=flag, typed=raw) if sep else low
    if high < low:
        raise UsageError(f"invalid {flag} {text!r}: the range's end is below its start; expected e.g. {flag} 8K-64K")
    return [low, high]


def worker_counts(text: Any, flag: str) -> list[int]:
    items = [item.strip() for item in str(text).split(",") if item.strip()]
    if not items:
        raise UsageError(f"invalid {flag} {text!r}: empty; expected worker counts, e.g. {flag} 0,2,4")
    return sorted({nonneg_int(item, flag) for item in items})


def nonneg(text: Any, flag: str) -> float:
    return parse_number(text, what=flag, example="200", minimum=0.0)


@dataclass
class Config:
    path: str | None = option(
        None,
        shown="the temp dir",
        help="directory (any mount) to write the dataset under, in a unique directory removed afterwards",
    )
    target: str | None = option(
        None, shown="", help="s3://bucket/prefix to stream from over the S3 API (or a directory, as --path)"
    )
    layout: str = option("shards", parse=choice(LAYOUTS), help="shards (WebDataset tar) or files (one per sample)")
    samples: int = option(10000, parse=positive_int, help="samples in the dataset (all ranks together)")
    sample_size: list[int] = option(
        [16 << 10, 16 << 10], parse=size_or_range, shown="16K", help="bytes per sample, fixed (16K) or a range (8K-64K)"
    )
    shard_size: int = option(
        256 << 20, parse=nbytes, shown="256M", help="bytes per tar shard at most (smaller for small datasets)"
    )
    workers: list[int] = option(
        [0, 2, 4], parse=worker_counts, shown="0,2,4", help="DataLoader num_workers values to sweep"
    )
    batch_size: int = option(32, parse=positive_int, help="samples per batch")
    prefetch_factor: int = option(2, parse=positive_int, help="batches each worker loads ahead")
    decode_us: float = option(
        0.0, parse=nonneg, shown="0", help="CPU time per sample in the worker, as a decode would take"
    )
    nproc: int = option(
        1, parse=positive_int, record=False, help="local ranks to spawn when not launched by torchrun/srun/mpirun"
    )
    endpoint: str | None = option(
        None,
        record=False,
        shown="embedded server",
        metavar="URL",
        help="S3 endpoint for s3:// targets (AWS credentials from the environment)",
    )
    keep: bool = option(False, switch=True, help="keep the dataset afterwards")
    timeout_s: float = option(
        300.0,
        parse=timeout,
        flag="--timeout",
        record=False,
        shown="300",
        help="seconds before a silent peer, or an S3 request unfinished, fails the run",
    )
    ranks: int = 1
    device: str = "cpu"


def validate(config: Config) -> Config:
    """Refuse misuse before anything is written: the target, a sample over a shard, the space."""
    from ...targets import checkpoint_target as ct
    from ...targets.workdir import check_base
    from ...world.launch import detect_world

    if config.path is not None and config.target is not None:
        raise UsageError(
            f"--path {config.path!r} and --target {config.target!r} both name the dataset's place; "
            f"give one, e.g. --path /data or --target s3://bucket/prefix"
        )
    where = config.target if config.target is not None else (config.path or tempfile.gettempdir())
    target = ct.parse_target(where)
    if target.kind == "local":
        check_base(target.path, writable=True, flag="--target" if config.target is not None else "--path")
    elif config.endpoint is not None:
        from ...targets.s3client import check_endpoint

        check_endpoint(config.endpoint)
    if config.endpoint is not None and target.kind != "s3":
        raise UsageError(f"--endpoint only applies to s3:// targets; the dataset goes to {target.path!r}")
    low, high = config.sample_size
    if config.layout == "shards" and ds.tar_bytes(high) > config.shard_size:
        raise UsageError(
            f"invalid --sample-size {format_size_exact(high)}: larger than a shard (--shard-size "
            f"{format_size_exact(config.shard_size)}, {ds.TAR_BLOCK} bytes of which a member's header); use a "
            f"larger --shard-size, e.g. --shard-size {format_size_exact(1 << (ds.tar_bytes(high) * 4).bit_length())}"
        )
    world = detect_world()
    ranks = world.size if world is not None else config.nproc
    if target.kind == "local":
        # At least `low` bytes a sample: checked before the plan, which takes time in proportion
        # to the samples (minutes for a trillion), and then with the plan's own bytes.
        _check_space(config, target.path, config.samples * low)
    plan = ds.plan_for(replace(config, ranks=ranks))
    if target.kind == "local":
        _check_space(config, target.path, plan.disk_bytes())
    from ...world.backends import cuda_usable

    return replace(config, target=target.display, path=None, ranks=ranks, device="cuda" if cuda_usable() else "cpu")


def _check_space(config: Config, path: str, data_bytes: int) -> None:
    from ...targets.workdir import free_bytes

    need, free = data_bytes + (16 << 20), free_bytes(path)
    if need > free:
        raise UsageError(
            f"not enough free space for {config.samples} samples of {_sizes(config.sample_size)} in "
            f"{config.layout}: needs about {format_bytes_human(need)} but {path} has "
            f"{format_bytes_human(free)} free; use fewer --samples or another --path"
        )


def _sizes(pair: list[int]) -> str:
    return format_size(pair[0]) if pair[0] == pair[1] else f"{format_size(pair[0])}-{format_size(pair[1])}"


class _DataloadRequired(ProbeRow):
    layout: str
    workers: int
    batch_size: int
    samples: int
    sample_bytes_mean: float
    ranks: int
    samples_per_s: float
    read_gbps: float
    first_batch_s: float
    batch_wait_us_p50: float
    batch_wait_us_p99: float
    served_from_memory: bool


class DataloadRow(_DataloadRequired, total=False):
    shards: int
    shard_bytes: int
    s3_requests: float  # GETs per pass (median over iterations)


class DataloadProbe(Probe):
    name = "dataload"

    def __init__(self, config: Config, world: World, data: Any):
        self.config, self.world, self.data = config, world, data
        self.plan: ds.Plan = data.plan
        self.rank = world.rank if world is not None else 0
        self.ranks = world.size if world is not None else 1
        self.epoch = 0
        self.last_wrong = 0
        self.last: dict[str, Any] = {}

    def unavailable_reason(self) -> str | None:
        try:
            import torch.utils.data  # noqa: F401
        except ImportError:
            return "torch is not installed (the DataLoader is torch's)"
        return None

    def implementation(self) -> dict[str, Any]:
        return {
            "engine": "torch.utils.data.DataLoader",
            "layout": self.config.layout,
            "sampler": ("RandomSampler (shuffle, seeded)" if self.ranks == 1 else "DistributedSampler(shuffle)")
            if self.config.layout == "files"
            else "IterableDataset: shards dealt to ranks, then to workers",
            "pin_memory": "each batch pinned in the training loop" if self.config.device == "cuda" else False,
            "prefetch_factor": self.config.prefetch_factor,
            "decode_us": self.config.decode_us,
            **self.data.facts,
        }

    def cases(self) -> list[Case]:
        return [Case(self.config.layout, self.plan.total_bytes, (("workers", w),)) for w in self.config.workers]

    def row_fields(self, case: Case) -> dict[str, Any]:
        fields = {
            "layout": self.config.layout,
            "batch_size": self.config.batch_size,
            "samples": self.plan.samples,
            "sample_bytes_mean": self.plan.total_bytes / self.plan.samples,
            "ranks": self.ranks,
            "served_from_memory": self.data.memory_backed,
        }
        if self.plan.shards:
            fields.update(shards=len(self.plan.shards), shard_bytes=self.plan.shard_bytes)
        return fields

    def run_once(self, case: Case) -> Timed:
        from .loader import loader, one_pass

        workers = int(case.param("workers"))
        if self.world is None or self.world.spec.local_rank == 0:
            self.data.drop_cache()
        if self.world is not None:
            self.world.barrier()
        self.epoch += 1
        try:
            result = one_pass(
                lambda: loader(
                    self.data.source,
                    self.plan,
                    workers=workers,
                    batch_size=self.config.batch_size,
                    prefetch_factor=self.config.prefetch_factor,
                    decode_us=self.config.decode_us,
                    rank=self.rank,
                    ranks=self.ranks,
                    pin_memory=self.config.device == "cuda",
                    epoch=self.epoch,
                ),
                pin=self.config.device == "cuda",
            )
        except (KeyboardInterrupt, SystemExit):
            raise
        except Exception as exc:
            from ...core.errors import MicrobenchError, RunError

            if isinstance(exc, MicrobenchError):
                raise
            _quiet_dead_iterators()
            raise RunError(f"{_failure(exc)} (rank {self.rank}, {case.label})") from None
        from ...core.stats import percentile

        waits = result.waits_s or [0.0]
        mine = (
            result.samples,
            result.bytes,
            result.wrong,
            result.requests,
            result.first_batch_s,
            percentile(waits, 50),
            percentile(waits, 99),
        )
        every = self.world.all_gather_object(mine) if self.world is not None else [mine]
        self.last_wrong = result.wrong
        self.last = {"samples": sum(e[0] for e in every), "bytes": sum(e[1] for e in every)}
        extra = {
            "first_batch_s": max(e[4] for e in every),
            "batch_wait_us_p50": max(e[5] for e in every) * 1e6,
            "batch_wait_us_p99": max(e[6] for e in every) * 1e6,
        }
        if self.data.source.is_s3:
            extra["s3_requests"] = sum(e[3] for e in every)
        return Timed(result.time_s, extra)

    def check(self, case: Case) -> int:
        # Every sample of the last timed pass was checked as it was read.
        return self.last_wrong

    def metrics(self, case: Case, time_s: float) -> dict[str, Any]:
        samples = self.last.get("samples", self.plan.samples)
        nbytes = self.last.get("bytes", self.plan.total_bytes)
        return {"samples_per_s": samples / time_s, "read_gbps": nbytes / time_s / 1e9}


def _quiet_dead_iterators() -> None:
    """After a worker died, torch's half-made loader iterator can fail again in its __del__
    (`_workers_status` never set) and Python prints that to stderr at collection: the failure
    is already said in one line, so only those are dropped; anything else still prints."""
    import sys

    default = sys.unraisablehook

    def hook(unraisable: Any) -> None:
        if "DataLoaderIter.__del__" in repr(unraisable.object):
            return
        default(unraisable)

    sys.unraisablehook = hook


def _failure(exc: BaseException) -> str:
    """One line for a loader failure: a dead worker as torch names it, or a worker's exception
    (re-raised here with its traceback as text: its last line says what it was)."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    if not lines:
        return f"DataLoader failed: {type(exc).__name__}"
    if "DataLoader worker" in lines[0] and "Original Traceback" not in str(exc):
        return f"{lines[0].rstrip('. ')}: a DataLoader worker died"
    if "Original Traceback" in str(exc):
        return f"{lines[0].rstrip('.')}: {lines[-1][:200]}"
    return f"DataLoader failed: {type(exc).__name__}: {lines[0][:200]}"


SPEC = ProbeSpec(
    name="dataload",
    command=("dataload",),
    order=62,
    help="training-batch streaming through torch DataLoader: files or WebDataset shards, local or S3",
    description="Write a synthetic dataset (one file per sample, or WebDataset tar shards) to a directory or an "
    "s3:// prefix, drop its cached pages, and read it through torch.utils.data.DataLoader as a trainer "
    "does, for each --workers count; every sample is checked. samples/s and GB/s are all ranks' samples "
    "over the slowest rank's pass.",
    metrics=("samples_per_s", "read_gbps"),
    config=Config,
    build=lambda config, context: DataloadProbe(config, context.world, context.run_dir),
    row_schema=DataloadRow,
    validate=validate,
    run=run,
    printer=print_report,
    sweep=SweepDefaults(warmup=0, iters=1, budget_s=30.0, check=True),
    needs=Needs(world=True, target=True, s3=True),
    case_keys=("workers", "layout"),
    identity_keys=("layout",),
    feeds=("dataload",),
    suite=(
        SuiteStep(
            "dataload",
            ("--path", "{path}", "--samples", "2000", "--sample-size", "16K", "--workers", "0,2"),
            ops=("shards",),
        ),
    ),
)
