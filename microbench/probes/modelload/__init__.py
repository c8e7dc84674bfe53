"""Loading a model as `from_pretrained` does, from a cold page cache.

A Hugging Face-style directory (model_dir.py: `model-0000K-of-0000N.safetensors` shards and the
index) of `--size` bytes, or of a composer preset's weights (`--model gemma-3-12b --dtype
bfloat16`, capped by free space and memory), is written once with safetensors, in a directory
(`--path`, any mount) or under an S3 prefix (`--target s3://`, the embedded server unless
`--endpoint`; store.py: each shard fetched whole with ranged parallel GETs, then parsed). Cases, each
timed from a barrier after the shards' cached pages were dropped to the slowest rank's end:
  raw_read         every rank reads every shard front to back, nothing parsed: raw_read_gbps.
  every-rank       every rank loads every shard with safetensors.torch.load_file (onto its GPU
                   when there is one), as each process of a job does without CPU-RAM-efficient
                   loading.
  rank0-broadcast  rank 0 loads, the others receive every tensor over the world's collective
                   (broadcast), as accelerate's CPU-RAM-efficient loading does.
load_gbps = model bytes / load_s (the slowest rank's time, 1e9 B/s); every tensor of the last
load is checked element by element.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass, replace
from typing import Any

from ...core.errors import UsageError
from ...core.options import choice, nbytes, option, positive_int, timeout
from ...core.probe import Case, Probe, Timed
from ...core.registry import Needs, ProbeSpec, SuiteStep, SweepDefaults
from ...core.units import DTYPE_BYTES, DTYPES, format_bytes_human, format_size, format_size_exact, memory_shortfall
from ...results.schema import ProbeRow
from ...world.dist import World
from . import model_dir as md
from .run import print_report, run

MODES = ("every-rank", "rank0-broadcast")


def modes(text: Any, flag: str) -> list[str]:
    """A comma list of MODES, in the given order, without repeats."""
    out: list[str] = []
    for item in (part.strip() for part in str(text).split(",")):
        if item not in MODES:
            raise UsageError(f"invalid {flag} {item!r}: expected one or more of {', '.join(MODES)}, "
                             f"e.g. {flag} rank0-broadcast")
        if item not in out:
            out.append(item)
    return out


@dataclass
class Config:
    path: str | None = option(None, shown="the temp dir", help="directory (any mount) to write the model under, in "
                              "a unique directory removed afterwards")
    target: str | None = option(None, shown="", help="s3://bucket/prefix to write the model under and load it from "
                                "over the S3 API (or a directory, as --path)")
    endpoint: str | None = option(None, record=False, shown="embedded server", metavar="URL",
                                  help="S3 endpoint for s3:// targets (AWS credentials from the environment)")
    size_bytes: int = option(
        1 << 30, parse=nbytes, flag="--size", shown="1G", help="model bytes (ignored with --model)"
    )
    model: str | None = option(None, shown="", help="a composer preset whose weights to write (e.g. gemma-3-12b), "
                               "capped by free space and memory")
    dtype: str = option("bfloat16", parse=choice(DTYPES), help=f"one of {', '.join(DTYPES)}")
    mode: list[str] = option(["every-rank"], parse=modes, shown="every-rank",
                             help="every-rank, rank0-broadcast or both")
    nproc: int = option(1, parse=positive_int, record=False,
                        help="local ranks to spawn when not launched by torchrun/srun/mpirun")
    keep: bool = option(False, switch=True, help="keep the model directory afterwards")
    timeout_s: float = option(300.0, parse=timeout, flag="--timeout", record=False, shown="300",
                              help="seconds before a silent peer, or an S3 request unfinished, fails the run")
    ranks: int = 1
    capped_from_bytes: int | None = None
    device: str = "cpu"
    backend: str = "gloo"


def validate(config: Config) -> Config:
    """The model's size from --size or --model, refused (with the numbers) when it cannot fit
    the free space or the memory every rank's copy needs."""
    from ...targets import checkpoint_target as ct
    from ...targets.workdir import check_base, free_bytes
    from ...world import backends
    from ...world.launch import detect_world
    from ...world.policy import free_memory_bytes

    if config.path is not None and config.target is not None:
        raise UsageError(f"--path {config.path!r} and --target {config.target!r} both name the model's place; "
                         f"give one, e.g. --path /models or --target s3://bucket/prefix")
    target = ct.parse_target(config.target if config.target is not None else (config.path or tempfile.gettempdir()))
    if config.endpoint is not None and target.kind != "s3":
        raise UsageError(f"--endpoint only applies to s3:// targets; the model goes to {target.path!r}")
    if target.kind == "s3" and config.endpoint is not None:
        from ...targets.s3client import check_endpoint

        check_endpoint(config.endpoint)
    # Free space is checked where the bytes land: the directory, or the embedded server's temp dir.
    base = target.path if target.kind == "local" else tempfile.gettempdir()
    check_base(base, writable=True, flag="--target" if config.target is not None else "--path")
    world = detect_world()
    ranks = world.size if world is not None else config.nproc
    elem = DTYPE_BYTES[config.dtype]
    size_bytes, capped = config.size_bytes, None
    free_mem = free_memory_bytes("cpu")
    if config.model is not None:
        from ...compose.model import preset

        size_bytes = preset(config.model).total_params * elem
        # Capped to what fits: 80% of the free space, and host memory for every rank's copy.
        room = min(int(free_bytes(base) * 0.8), int(free_mem * 0.8) // max(ranks, 1) - 3 * md.TENSOR_BYTES)
        if size_bytes > room:
            size_bytes, capped = max(room, md.COLUMNS * elem), size_bytes
    if size_bytes < md.COLUMNS * elem:
        raise UsageError(f"invalid --size {format_size_exact(size_bytes)}: below one {md.COLUMNS}-element row of "
                         f"{config.dtype} ({md.COLUMNS * elem} bytes); e.g. --size 1G")
    if target.kind == "local" or config.endpoint is None:
        ct.check_free_space(base, size_bytes + (16 << 20), f"a {format_bytes_human(size_bytes)} model")
    need = ranks * (size_bytes + 3 * md.TENSOR_BYTES)   # every rank's loaded copy, and a check's pattern
    shortfall = memory_shortfall(need, free_mem, "host memory")
    if shortfall:
        raise UsageError(f"--size {format_size(size_bytes)} loaded by {ranks} rank(s) {shortfall}; "
                         f"use a smaller --size or fewer ranks")
    chosen = backends.choose("auto")
    return replace(
        config,
        path=None,
        target=target.display,
        size_bytes=size_bytes,
        capped_from_bytes=capped,
        ranks=ranks,
        device=chosen.device,
        backend=chosen.backend,
    )


class _ModelloadRequired(ProbeRow):
    ranks: int
    dtype: str
    shards: int
    tensors: int


class ModelloadRow(_ModelloadRequired, total=False):
    load_gbps: float
    load_s: float
    raw_read_gbps: float
    aggregate_read_gbps: float    # every-rank: all ranks' bytes read / the slowest rank's time


class ModelloadProbe(Probe):
    name = "modelload"

    def __init__(self, config: Config, world: World, model: Any):
        import torch

        self.torch, self.config, self.world, self.model = torch, config, world, model
        self.layout: md.Layout = model.layout
        self.rank = world.rank if world is not None else 0
        self.ranks = world.size if world is not None else 1
        self.device = f"cuda:{torch.cuda.current_device()}" if config.device == "cuda" else "cpu"
        self.params: dict[str, Any] | None = None
        self.raw_gbps: float | None = None

    def unavailable_reason(self) -> str | None:
        return md.safetensors_missing()

    def implementation(self) -> dict[str, Any]:
        import safetensors

        engine = "load_file" if self.model.facts.get("target_kind") == "local" else "load (the fetched bytes)"
        return {"engine": f"safetensors.torch.{engine} (safetensors {safetensors.__version__})",
                "device": self.device, "backend": self.config.backend if self.world is not None else None,
                "broadcast": "torch.distributed.broadcast per tensor from rank 0", **self.model.facts}

    def cases(self) -> list[Case]:
        return [Case(op, self.layout.total_bytes) for op in ("raw_read", *self.config.mode)]

    def row_fields(self, case: Case) -> dict[str, Any]:
        return {"ranks": self.ranks, "dtype": self.config.dtype, "shards": self.layout.shards,
                "tensors": len(self.layout.tensors)}

    def _cold(self) -> None:
        # Every rank's pages on this node dropped by its first rank, then all start together.
        if self.world is None or self.world.spec.local_rank == 0:
            self.model.drop_cache()
        if self.world is not None:
            self.world.barrier()

    def prepare(self, case: Case) -> None:
        if case.op != "raw_read" and self.params is None:
            # The model's own parameters, allocated once and untimed (from_pretrained builds the
            # model first); a load copies every tensor into them. safetensors' load_file returns
            # tensors over an mmap of the file, read only when touched: without this copy a
            # "load" would read almost nothing.
            dtype = getattr(self.torch, self.layout.dtype)
            self.params = {t.name: self.torch.empty((t.rows, md.COLUMNS), dtype=dtype, device=self.device)
                           for t in self.layout.tensors}
        if self.params is not None:
            for value in self.params.values():
                value.zero_()

    def run_once(self, case: Case) -> Timed:
        self._cold()
        start = time.perf_counter()
        if case.op == "raw_read":
            self.model.raw_read()
        elif case.op == "every-rank" or self.world is None:
            self._load()
        else:
            self._broadcast()
        if self.device != "cpu":
            self.torch.cuda.synchronize()
        return Timed(time.perf_counter() - start)

    def _load(self) -> None:
        assert self.params is not None
        for shard in self.model.shards():   # from_pretrained's loop: one shard after another
            for name, tensor in shard.items():
                self.params[name].copy_(tensor)

    def _broadcast(self) -> None:
        import torch.distributed as dist

        assert self.params is not None
        if self.rank == 0:
            self._load()
        for t in self.layout.tensors:
            # Bytes on the wire: gloo reduces no bfloat16, and a broadcast needs no arithmetic.
            dist.broadcast(self.params[t.name].view(-1).view(self.torch.uint8), src=0)

    def check(self, case: Case) -> int:
        if case.op == "raw_read":
            return 0
        assert self.params is not None
        return md.count_wrong(self.torch, self.layout, self.params)

    def metrics(self, case: Case, time_s: float) -> dict[str, Any]:
        gbps = case.size_bytes / time_s / 1e9
        if case.op == "raw_read":
            self.raw_gbps = gbps
            return {"raw_read_gbps": gbps, "load_s": time_s}
        out = {"load_gbps": gbps, "load_s": time_s}
        if self.raw_gbps is not None:
            out["raw_read_gbps"] = self.raw_gbps
        if case.op == "every-rank":
            out["aggregate_read_gbps"] = gbps * self.ranks
        return out



SPEC = ProbeSpec(
    name="modelload",
    command=("modelload",),
    order=63,
    help="model loading as from_pretrained does: safetensors shards from a cold cache, "
    "every rank or rank 0 + broadcast",
    description="Write a Hugging Face-style safetensors model directory (--size bytes or --model's weights), drop "
    "its cached pages and load it as from_pretrained does: every shard through safetensors.torch.load_file "
    "on every rank, or on rank 0 with a broadcast to the others; beside it, a raw sequential read of the "
    "same files. Every tensor is checked.",
    metrics=("load_gbps", "raw_read_gbps"),
    config=Config,
    build=lambda config, context: ModelloadProbe(config, context.world, context.run_dir),
    row_schema=ModelloadRow,
    validate=validate,
    run=run,
    printer=print_report,
    sweep=SweepDefaults(warmup=0, iters=1, budget_s=30.0, check=True),
    needs=Needs(world=True, target=True, s3=True),
    case_keys=("dtype",),
    identity_keys=("device",),
    feeds=("modelload",),
    suite=(SuiteStep("modelload", ("--path", "{path}", "--size", "128M"), ops=("raw_read", "every-rank")),),
)
