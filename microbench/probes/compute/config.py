"""compute's option table, the checks made before anything is timed, and the matmul shapes a block's
cases are made of."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from ...core.errors import ProbeUnavailable, UsageError
from ...core.options import option, positive_int
from ...core.units import DTYPE_BYTES

# A CPU takes seconds per matmul at 4096 tokens. 256 reads low (here, a shared 2-core VM: 39 GFLOP/s
# at 256 rows vs 55 at 2048 for a 4096 x 4096 weight), so --tokens with the real shape is better.
CPU_TOKENS = 256
GPU_TOKENS = 4096
DEFAULT_MODEL = "llama-3.1-8b"


@dataclass
class Config:
    model: str | None = option(None, shown=DEFAULT_MODEL, help="a composer preset whose shapes to time")
    model_config: str | None = option(
        None, metavar="FILE", record=False, help="a Hugging Face config.json instead of --model"
    )
    tokens: int | None = option(
        None,
        parse=positive_int,
        shown="",
        help=f"tokens per matmul (micro-batch x sequence; default {GPU_TOKENS} on a GPU, {CPU_TOKENS} on a CPU)",
    )
    device: str = option("auto", choices=("auto", "cuda", "cpu"), help="auto: cuda when torch sees a GPU, else cpu")
    dtype: str | None = option(
        None, choices=tuple(sorted(DTYPE_BYTES)), shown="", help="default bfloat16 on a GPU, float32 on a CPU"
    )
    # The model's shapes, from --model or --model-config (validate), or given by a caller.
    hidden: int = 0
    q_dim: int = 0
    kv_dim: int = 0
    ffn: int = 0
    vocab: int = 0
    layers: int = 0
    experts: int = 1
    top_k: int = 1
    backward: bool = False  # also time backward's two matmuls per projection
    micro_batch: int | None = option(
        None,
        parse=positive_int,
        shown="",
        help="time one training step's kernels (matmuls, attention, memory-bound) at "
        "this micro-batch x --seq-len, e.g. --micro-batch 2 --seq-len 8192",
    )
    seq_len: int | None = option(None, parse=positive_int, shown="", help="tokens per sequence (with --micro-batch)")
    activation_checkpointing: str = option(
        "none",
        metavar="MODE",
        help="none, full, blocks:F or ops: what the step recomputes (the kernels' weights in the step), e.g. ops",
    )
    # Why a CPU is timed (no GPU visible), for the printout; and whether --tokens was given.
    why_cpu: str | None = field(default=None, metadata={"record": False})
    tokens_given: bool = field(default=True, metadata={"record": False})


def _device_resolved(config: Config) -> Config:
    """A Config built by a library caller (verify, a benchmark) without validate: "auto" and a
    missing dtype resolve as the command resolves them."""
    if config.device != "auto" and config.dtype is not None:
        return config
    from ...world.backends import cuda_usable

    device = config.device if config.device != "auto" else ("cuda" if cuda_usable() else "cpu")
    return replace(config, device=device, dtype=config.dtype or ("bfloat16" if device == "cuda" else "float32"))


def validate(config: Config) -> Config:
    """Shapes from the preset or config.json, the device torch sees, its dtype and token count."""
    from ...compose.model import CrudeModel, from_hf_config, preset

    if config.model is not None and config.model_config is not None:
        raise UsageError(
            f"--model {config.model!r} and --model-config {config.model_config!r} both name the model "
            f"to time; give one, e.g. --model-config {config.model_config}"
        )
    shape = from_hf_config(config.model_config) if config.model_config else preset(config.model or DEFAULT_MODEL)
    if isinstance(shape, CrudeModel):  # pragma: no cover - presets always have shapes
        raise UsageError("compute needs real shapes: --model NAME or --model-config FILE")
    try:
        import torch  # noqa: F401
    except ImportError:
        raise ProbeUnavailable("compute: torch is not installed") from None
    from ...world.backends import cuda_usable

    if config.device == "cuda" and not cuda_usable():
        raise ProbeUnavailable("compute: --device cuda but no CUDA device is visible to torch")
    resolved = _device_resolved(config)  # device and dtype, as a library caller gets them
    why_cpu = (
        "no CUDA device visible to torch: timing the CPU in float32"
        if config.device == "auto" and resolved.device == "cpu"
        else None
    )
    tokens = config.tokens or (GPU_TOKENS if resolved.device == "cuda" else CPU_TOKENS)
    kernel_mode = config.micro_batch is not None or config.seq_len is not None
    if kernel_mode:
        from ...compose.kernels import parse_checkpointing

        if config.tokens is not None:
            raise UsageError(
                "--tokens and --micro-batch/--seq-len both set the shapes; give one, e.g. "
                "--micro-batch 1 --seq-len 2048"
            )
        parse_checkpointing(config.activation_checkpointing)
        micro_batch, seq_len = config.micro_batch or 1, config.seq_len or 4096
        config = replace(config, micro_batch=micro_batch, seq_len=seq_len)
        tokens = micro_batch * seq_len
    resolved = replace(
        resolved,
        micro_batch=config.micro_batch,
        seq_len=config.seq_len,
        **shape_fields(shape),
        tokens=tokens,
        why_cpu=why_cpu,
        tokens_given=config.tokens is not None,
    )
    if not kernel_mode:
        _check_memory(resolved)
    return resolved


def shape_fields(shape: Any) -> dict[str, Any]:
    """The Config's shape fields from a composer ModelShape: the probe's and verify's replay's."""
    return {
        "model": shape.name,
        "hidden": shape.hidden,
        "q_dim": shape.heads * shape.head_dim,
        "kv_dim": shape.kv_heads * shape.head_dim,
        "ffn": shape.ffn,
        "vocab": shape.vocab,
        "layers": shape.layers,
        "experts": shape.experts,
        "top_k": shape.top_k,
    }


def _check_memory(config: Config) -> None:
    """The largest matmul's operands, made in float32 on the host and then cast (and moved), must
    fit the host's memory: --tokens 100000000 is refused here, not met as a failed allocation."""
    from ...core.units import memory_shortfall
    from ...world.policy import free_memory_bytes

    assert config.dtype is not None  # resolved by validate
    esize = DTYPE_BYTES[config.dtype]
    op, m, n, k, _ = max(matmul_shapes(config), key=lambda s: s[1] * s[3] + s[3] * s[2] + s[1] * s[2])
    need = (m * k + k * n) * 4 + ((m * k + k * n + m * n) * esize if config.device == "cpu" else 0)
    shortfall = memory_shortfall(need, free_memory_bytes("cpu"), "host memory")
    if shortfall:
        raise UsageError(
            f"invalid --tokens {config.tokens}: the {op} matmul ({m} x {k} by {k} x {n}) {shortfall}; "
            f"use fewer --tokens, "
            f"e.g. --tokens {CPU_TOKENS if config.device == 'cpu' else GPU_TOKENS}"
        )


def _shape(config: Config) -> Any:
    from ...compose.model import from_hf_config, preset

    return from_hf_config(config.model_config) if config.model_config else preset(config.model or DEFAULT_MODEL)


def backward_shapes(op: str, m: int, n: int, k: int) -> list[tuple[str, int, int, int]]:
    """Backward of y (m x n) = x (m x k) @ w (k x n): the input's gradient dy @ w^T (m x n @ n x
    k) and the weight's x^T @ dy (k x m @ m x n), both as many FLOPs as forward but other shapes
    (the weight's has the tokens as its inner dimension), which a CPU BLAS runs at other rates."""
    return [(f"{op}.dgrad", m, k, n), (f"{op}.wgrad", k, n, m)]


def matmul_shapes(cfg: Config) -> list[tuple[str, int, int, int, float]]:
    """(op, m, n, k, times per block) for one block plus the head; with `backward`, each
    projection's two backward matmuls after it."""
    t, h = cfg.tokens, cfg.hidden
    assert t is not None  # resolved by validate
    expert_tokens = max(1, round(t * cfg.top_k / cfg.experts)) if cfg.experts > 1 else t
    forward = [
        ("qkv", t, cfg.q_dim + 2 * cfg.kv_dim, h, 1.0),
        ("attn_out", t, h, cfg.q_dim, 1.0),
        ("mlp_gate_up", expert_tokens, 2 * cfg.ffn, h, float(cfg.experts)),
        ("mlp_down", expert_tokens, h, cfg.ffn, float(cfg.experts)),
        ("head", t, cfg.vocab, h, 1.0 / cfg.layers),
    ]
    if not cfg.backward:
        return forward
    out = []
    for op, m, n, k, w in forward:
        out.append((op, m, n, k, w))
        out += [(name, bm, bn, bk, w) for name, bm, bn, bk in backward_shapes(op, m, n, k)]
    return out
