"""The checkpoint probe's option table and the checks made before any rank starts."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ...core.errors import UsageError
from ...core.options import choice, nbytes, option, positive_int, timeout
from ...core.units import DTYPE_BYTES, DTYPES, format_bytes_human
from .state_layout import Item

ROW_ELEMS = 1024           # columns per tensor
TENSOR_BYTES = 64 << 20    # global bytes per tensor, the order of one large transformer weight
STATE_DICTS = ("sharded", "full")
FORMATS = ("dcp", "torch", "safetensors")


@dataclass
class Config:
    # For the record: the target as given (a directory or s3://bucket/prefix); the run's own
    # directory lives under it.
    target: str = option(help="directory or s3://bucket/prefix; the run writes only inside a unique directory it "
                              "creates there and removes afterwards")
    size_bytes: int = option(1 << 30, parse=nbytes, flag="--size", shown="1G",
                             help="total checkpoint bytes across all ranks, binary units")
    nproc: int | None = option(None, parse=positive_int, record=False, shown="number of GPUs, else 2",
                               help="local ranks to spawn when not launched by torchrun/srun/mpirun")
    async_save: bool = option(False, switch=True, flag="--async",
                              help="also time dcp.async_save: time training is blocked vs time until durable")
    endpoint: str | None = option(None, record=False, shown="",
                                  help="S3 endpoint URL for s3:// targets (credentials from the standard AWS "
                                       "environment/profile); default: start an embedded server (rclone serve s3)")
    dtype: str = option("float32", parse=choice(DTYPES), help=f"one of {', '.join(DTYPES)}")
    thread_count: int = option(1, parse=positive_int, flag="--threads", help="DCP writer threads per rank")
    requested_backend: str = option("auto", flag="--backend", record=False, shown="auto: nccl with CUDA, else gloo",
                                    help="auto, nccl or gloo")
    keep: bool = option(False, switch=True, help="keep the run's checkpoint directory instead of removing it")
    check: bool = option(True, record=False, shown="on", help="load what was saved and compare every element")
    state_dict: str = option("sharded", parse=choice(STATE_DICTS), flag="--state-dict",
                             help="sharded: every rank saves its shard (a DCP save); full: the state gathered to "
                                  "rank 0 (get_state_dict full_state_dict, cpu_offload) and written by one process, "
                                  "as Hugging Face Accelerate/Trainer's FULL_STATE_DICT does")
    save_format: str | None = option(
        None,
        parse=choice(FORMATS),
        flag="--format",
        shown="dcp; torch with --state-dict full",
        help="dcp (sharded), torch (torch.save of the full state) or safetensors (the full "
        "state's tensors with safetensors)",
    )
    timeout_s: float = option(300.0, parse=timeout, flag="--timeout", record=False, shown="300",
                              help="seconds before a silent peer fails the run")
    device: str = "cpu"
    backend: str = "gloo"
    tensors: int = 0                # 0: as many as TENSOR_BYTES needs; else this many (a model's item count)
    items: tuple[Item, ...] = ()    # a real state's layout to mirror; then size_bytes and tensors are ignored


def validate(config: Config) -> Config:
    """Every flag checked before any rank starts, so misuse fails fast with exit 2."""
    from ...targets import checkpoint_target as ct
    from ...world import backends
    from ...world.launch import detect_world
    from ...world.policy import local_ranks

    target = ct.parse_target(config.target)
    if config.endpoint is not None and target.kind != "s3":
        raise UsageError(f"--endpoint only applies to s3:// targets; --target {config.target!r} is a directory")
    fmt = config.save_format or ("torch" if config.state_dict == "full" else "dcp")
    if config.state_dict == "full" and fmt == "dcp":
        raise UsageError("invalid --format 'dcp' with --state-dict full: a full state dict is written by one process "
                         "with torch.save or safetensors; use --format torch or --format safetensors")
    if config.state_dict == "sharded" and fmt != "dcp":
        raise UsageError(f"invalid --format {fmt!r} with --state-dict sharded: a sharded save is a DCP save; use "
                         f"--state-dict full --format {fmt}")
    if config.state_dict == "full" and config.async_save:
        raise UsageError("--async times dcp.async_save, a sharded save; it does not apply to --state-dict full")
    if fmt == "safetensors":
        try:
            import safetensors.torch  # noqa: F401
        except ImportError:
            raise UsageError("--format safetensors needs the safetensors package (pip install safetensors); "
                             "or use --format torch") from None
    chosen = backends.choose(config.requested_backend)
    world = detect_world()
    nproc = config.nproc or local_ranks()
    ranks = world.size if world is not None else nproc
    try:
        layout(config.size_bytes, ranks, DTYPE_BYTES[config.dtype])  # too small for the world: fail now
    except UsageError as exc:
        from ...core.units import format_size_exact

        raise UsageError(
            f"invalid --size {format_size_exact(config.size_bytes)!r}: {str(exc).split(': ', 1)[1]}"
        ) from None
    return replace(config, target=target.display, nproc=nproc, device=chosen.device, backend=chosen.backend,
                   save_format=fmt)


def host_bytes_per_rank(size_bytes: int, nranks: int, async_save: bool) -> int:
    """Peak host memory one rank holds: the state, the load destination and (async) DCP's
    staging copy, plus pattern temporaries for one tensor."""
    shard = size_bytes // nranks
    return shard * (3 if async_save else 2) + 3 * TENSOR_BYTES


def full_host_bytes(size_bytes: int, save_format: str) -> int:
    """Host memory rank 0 needs on top of its shard for a full save: the whole gathered state
    (cpu_offload), and for safetensors the serialized copy it builds in memory (a load from S3
    also holds the downloaded bytes beside the tensors)."""
    return size_bytes * (2 if save_format == "safetensors" else 1) + 3 * TENSOR_BYTES


def layout(size_bytes: int, nranks: int, elem: int, tensors: int = 0) -> list[int]:
    """Rows per rank for each tensor: whole rows, an equal count on every rank, tensors of at
    most TENSOR_BYTES globally (or exactly `tensors` of them, to match a model's state dict,
    whose per-item cost DCP pays). Raises UsageError when the size cannot hold one row per rank."""
    row_bytes = ROW_ELEMS * elem
    rows_per_rank = size_bytes // (row_bytes * nranks)
    if rows_per_rank < 1:
        need = row_bytes * nranks
        raise UsageError(f"invalid --size {format_bytes_human(size_bytes)}: too small for {nranks} ranks; "
                         f"needs at least {need} bytes (one {row_bytes}-byte row per rank), e.g. --size 64M")
    ntensors = tensors or max(1, math.ceil(rows_per_rank * row_bytes * nranks / TENSOR_BYTES))
    ntensors = min(ntensors, rows_per_rank)
    base, extra = divmod(rows_per_rank, ntensors)
    return [base + (1 if i < extra else 0) for i in range(ntensors)]
