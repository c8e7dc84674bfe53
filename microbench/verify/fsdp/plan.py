"""What `microbench verify fsdp` will run, checked before any rank starts: the model shapes,
token counts, link profiles, a given calibration, and whether the models fit in memory."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...compose.calibration import checked
from ...core.errors import UsageError
from ...core.units import element_size, parse_positive_int
from ...results import load_record
from ...world.policy import free_memory_bytes, gpu_free_bytes_without_context
from .. import model as fm

DEFAULT_MODELS, DEFAULT_TOKENS = "small,medium", "256,512"


def shardings(text: str | None) -> list[str]:
    """--sharding: full (fully_shard over the world) and/or hybrid (HSDP: shard in a node,
    replicate across nodes), comma-separated."""
    items = [p.strip() for p in str(text or "full").split(",") if p.strip()]
    bad = [p for p in items if p not in ("full", "hybrid")]
    if bad or not items:
        raise UsageError(f"invalid --sharding {text!r}: expected full, hybrid or full,hybrid (HSDP: sharded within "
                         f"a node, replicated across nodes), e.g. --sharding full,hybrid")
    return list(dict.fromkeys(items))


def check_hybrid(shardings_: list[str], nodes: int, per_node: int) -> None:
    """Hybrid sharding needs nodes to replicate over and ranks in a node to shard over (exit 2)."""
    if "hybrid" in shardings_ and (nodes < 2 or per_node < 2):
        raise UsageError(f"invalid --sharding hybrid with {nodes} node(s) x {per_node} rank(s): HSDP shards within a "
                         f"node and replicates across nodes, so it needs 2 or more of each; e.g. a lab with "
                         f"`microbench lab up --hosts 2 --ranks-per-host 2` and --lab")


@dataclass
class VerifyOptions:
    """What verify fsdp runs, resolved from its flags (fsdp/options.py builds it; fsdp/run.run_fsdp takes it)."""
    shapes: dict[str, dict[str, Any]]       # name -> the keyword arguments of model.shape_from_args
    tokens: list[int]
    steps: int
    warmup: int
    tolerance_pct: float
    ckpt_tolerance_pct: float
    ckpt_reps: int
    timeout_s: float
    profiles: list[tuple[str, int | None]]  # (label, egress rate in bit/s or None for unshaped)
    backend: str = "auto"
    lab: str | None = None
    nproc: int | None = None                # as given: checked against the lab's hosts, else local ranks
    calibration: str | None = None          # a calibration record's path
    calibrate_only: bool = False
    checkpoint: bool = False
    ckpt_dir: str | None = None
    state_dicts: list[str] = field(default_factory=lambda: ["sharded"])   # with checkpoint: sharded, full
    json: str | None = None
    results_dir: str = "results"
    shardings: list[str] = field(default_factory=lambda: ["full"])   # full and/or hybrid (HSDP)
    cal_reps: int | None = None             # timed steps per calibration number (None: each one's default)


def ints(text: str, what: str, example: str) -> list[int]:
    return [parse_positive_int(t, what=what, example=example) for t in str(text).split(",") if t.strip()]


def shapes(model: str | None, models: str | None, dims: dict[str, int | None],
           matrix: bool) -> dict[str, dict[str, Any]]:
    """name -> the keyword arguments that rebuild the shape on every rank. dims: --hidden,
    --layers, --heads, --vocab as parsed (None where not given)."""
    explicit = {k: v for k in ("hidden", "layers", "heads", "vocab") if (v := dims.get(k)) is not None}
    if explicit:
        if model or models:
            raise UsageError(
                "--model/--models and --hidden/--layers/--heads/--vocab describe the model twice; give one"
            )
        kwargs: dict[str, Any] = {"model": None, "hidden": None, "layers": None, "heads": None, "vocab": None,
                                  **explicit}
        shape = fm.shape_from_args(**kwargs)
        return {shape.name: kwargs}
    names = models or model or (DEFAULT_MODELS if matrix else "small")
    out = {}
    for name in [n.strip() for n in names.split(",") if n.strip()]:
        kwargs = {"model": name, "hidden": None, "layers": None, "heads": None, "vocab": None}
        shape = fm.shape_from_args(**kwargs)
        fm.check_buildable(shape)
        out[shape.name] = kwargs
    return out


def calibration_from(path: str, backend: str, device: str) -> dict[str, Any]:
    record = load_record(path)
    cal = (record.get("summary") or {}).get("calibration") if isinstance(record.get("summary"), dict) else None
    if not isinstance(cal, dict) or not isinstance(cal.get("overlap"), (int, float)):
        raise UsageError(f"--calibration {path!r} is a {record.get('kind')!r} record without summary.calibration; "
                         f"expected one from `microbench verify fsdp --calibrate-only --json cal.json`")
    if cal.get("backend") != backend or cal.get("device", device) != device:
        raise UsageError(f"--calibration {path!r} was measured with {cal.get('backend')} on {cal.get('device')}; "
                         f"this run uses {backend} on {device}: calibrate here, e.g. `microbench verify fsdp "
                         f"--calibrate-only --json cal.json`")
    family = (cal.get("model") or {}).get("family") if isinstance(cal.get("model"), dict) else None
    if family != fm.FAMILY:
        raise UsageError(f"--calibration {path!r} was measured on another model ({family or 'unnamed'}); "
                         f"verify builds a {fm.FAMILY}: calibrate it, e.g. `microbench verify fsdp "
                         f"--calibrate-only --json cal.json`")
    checked(cal)
    return cal


def memory_need_bytes(shape: Any, tokens: int, ranks: int, precision: fm.Precision) -> float:
    """Per rank: the composer's FSDP memory check plus the unsharded copy the compute-alone
    comparison trains beside it. The composer's activation estimate counts bf16 elements
    (compose.fsdp.activation_bytes): scaled by this run's element size over bf16's, it stays as
    it is for bf16 on a GPU and doubles for fp32 on the CPU."""
    from ...compose.fsdp import TrainSpec, memory_check

    train = TrainSpec(ranks=ranks, micro_batch=1, seq_len=tokens, flops_per_rank=1.0,
                      param_dtype=precision.param_dtype, reduce_dtype=precision.reduce_dtype)
    check = memory_check(shape, train, None)
    scale = precision.bytes / element_size("bfloat16")
    replica = shape.total_params * (precision.bytes * 2) + (check.activation_bytes or 0) * scale
    return check.sharded_state_bytes + check.gathered_bytes + (check.activation_bytes or 0) * scale + replica


def check_memory(shape_kwargs: dict[str, dict[str, Any]], tokens: list[int], ranks: int, choice: Any) -> None:
    precision = fm.precision_for(choice.device)
    here = ranks if choice.device == "cpu" else 1
    if choice.device == "cuda":
        # Each rank has its own GPU: the one with the least free memory decides, read without
        # a CUDA context in this launcher; when NVML cannot say, the ranks' own start-up decides.
        frees = gpu_free_bytes_without_context(ranks)
        if not frees:
            return
        free = min(frees)
    else:
        free = free_memory_bytes(choice.device)
    where = "GPU memory" if choice.device == "cuda" else "host memory"
    for kwargs in shape_kwargs.values():
        shape = fm.shape_from_args(**kwargs)
        need = memory_need_bytes(shape, max(tokens), ranks, precision) * here
        if need > free * 0.8:
            raise UsageError(f"model {shape.name!r} ({shape.total_params / 1e9:.2f} B parameters) needs about "
                             f"{need / 2**30:.1f} GiB of {where} for {ranks} rank(s) at {max(tokens)} tokens, but "
                             f"{free / 2**30:.1f} GiB is free; use a smaller model, e.g. --model small")
