"""Matmul throughput at a model's own shapes: the FLOP rate the composer should use.

Per transformer block the cases are the four projections FSDP's compute is made of, with T
tokens: QKV (T x h @ h x (q + 2 kv)), attention output (T x q @ q x h), the gated MLP's
gate+up (T x h @ h x 2f) and down (T x f @ f x h), and the output head (T x h @ h x vocab).
A mixture of experts runs gate+up and down per expert on the tokens routed to it, T x top-k /
experts on average, so small-matmul efficiency is measured too. FLOPs per matmul 2 m n k;
achieved TFLOP/s = FLOPs / the slowest rank's median time (one process here). The summary's
`achieved_tflops` weights each case by how often a step runs it (experts x the expert cases,
1/layers for the head). With `backward`, each projection's two backward matmuls (input and
weight gradients) are cases too. Attention's own QK^T and AV (flash attention) are not timed by
the cases; the composer assumes the same rate for them. `replay.StepReplay` runs all of a dense step's
kernels, attention included, forward and backward, in step order (what `verify` predicts from).

With --micro-batch and --seq-len (and --activation-checkpointing) the cases are one training
step's kernels at the target's shapes instead (kernel_cases.py): every matmul shape the composer
prices, attention forward and backward, and the memory-bound kernels, each weighted by how often
the step runs it; `compose --compute` reads each kernel's rate from them.

On a GPU: torch.matmul in bfloat16 (cuBLAS, or hipBLAS on ROCm). Without one: float32 on the
CPU, which says what this machine does, not what a GPU would.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from ...core.errors import ProbeUnavailable, UsageError
from ...core.options import option, positive_int
from ...core.probe import Case, Probe
from ...core.registry import Needs, ProbeSpec, SuiteStep, SweepDefaults
from ...core.units import DTYPE_BYTES
from ...results.schema import ProbeRow

# A CPU takes seconds per matmul at 4096 tokens. 256 reads low (here, a shared 2-core VM: 39 GFLOP/s
# at 256 rows vs 55 at 2048 for a 4096 x 4096 weight), so --tokens with the real shape is better.
CPU_TOKENS = 256
GPU_TOKENS = 4096
DEFAULT_MODEL = "llama-3.1-8b"


@dataclass
class Config:
    model: str | None = option(None, shown=DEFAULT_MODEL, help="a composer preset whose shapes to time")
    model_config: str | None = option(None, metavar="FILE", record=False,
                                      help="a Hugging Face config.json instead of --model")
    tokens: int | None = option(None, parse=positive_int, shown="",
                         help=f"tokens per matmul (micro-batch x sequence; default {GPU_TOKENS} on a GPU, "
                              f"{CPU_TOKENS} on a CPU)")
    device: str = option("auto", choices=("auto", "cuda", "cpu"), help="auto: cuda when torch sees a GPU, else cpu")
    dtype: str | None = option(None, choices=tuple(sorted(DTYPE_BYTES)), shown="",
                               help="default bfloat16 on a GPU, float32 on a CPU")
    # The model's shapes, from --model or --model-config (validate), or given by a caller.
    hidden: int = 0
    q_dim: int = 0
    kv_dim: int = 0
    ffn: int = 0
    vocab: int = 0
    layers: int = 0
    experts: int = 1
    top_k: int = 1
    backward: bool = False           # also time backward's two matmuls per projection
    micro_batch: int | None = option(None, parse=positive_int, shown="",
                                     help="time one training step's kernels (matmuls, attention, memory-bound) at "
                                          "this micro-batch x --seq-len, e.g. --micro-batch 2 --seq-len 8192")
    seq_len: int | None = option(None, parse=positive_int, shown="", help="tokens per sequence (with --micro-batch)")
    activation_checkpointing: str = option("none", metavar="MODE",
                                           help="none, full, blocks:F or ops: what the step recomputes (the "
                                                "kernels' weights in the step), e.g. ops")
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
        raise UsageError(f"--model {config.model!r} and --model-config {config.model_config!r} both name the model "
                         f"to time; give one, e.g. --model-config {config.model_config}")
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
    resolved = _device_resolved(config)   # device and dtype, as a library caller gets them
    why_cpu = ("no CUDA device visible to torch: timing the CPU in float32"
               if config.device == "auto" and resolved.device == "cpu" else None)
    tokens = config.tokens or (GPU_TOKENS if resolved.device == "cuda" else CPU_TOKENS)
    kernel_mode = config.micro_batch is not None or config.seq_len is not None
    if kernel_mode:
        from ...compose.kernels import parse_checkpointing

        if config.tokens is not None:
            raise UsageError("--tokens and --micro-batch/--seq-len both set the shapes; give one, e.g. "
                             "--micro-batch 1 --seq-len 2048")
        parse_checkpointing(config.activation_checkpointing)
        micro_batch, seq_len = config.micro_batch or 1, config.seq_len or 4096
        config = replace(config, micro_batch=micro_batch, seq_len=seq_len)
        tokens = micro_batch * seq_len
    resolved = replace(resolved, micro_batch=config.micro_batch, seq_len=config.seq_len, model=shape.name,
                       hidden=shape.hidden, q_dim=shape.heads * shape.head_dim,
                       kv_dim=shape.kv_heads * shape.head_dim, ffn=shape.ffn, vocab=shape.vocab, layers=shape.layers,
                       experts=shape.experts, top_k=shape.top_k, tokens=tokens, why_cpu=why_cpu,
                       tokens_given=config.tokens is not None)
    if not kernel_mode:
        _check_memory(resolved)
    return resolved


def _check_memory(config: Config) -> None:
    """The largest matmul's operands, made in float32 on the host and then cast (and moved), must
    fit the host's memory: --tokens 100000000 is refused here, not met as a failed allocation."""
    from ...core.units import memory_shortfall
    from ...world.policy import free_memory_bytes

    assert config.dtype is not None   # resolved by validate
    esize = DTYPE_BYTES[config.dtype]
    op, m, n, k, _ = max(matmul_shapes(config), key=lambda s: s[1] * s[3] + s[3] * s[2] + s[1] * s[2])
    need = (m * k + k * n) * 4 + ((m * k + k * n + m * n) * esize if config.device == "cpu" else 0)
    shortfall = memory_shortfall(need, free_memory_bytes("cpu"), "host memory")
    if shortfall:
        raise UsageError(f"invalid --tokens {config.tokens}: the {op} matmul ({m} x {k} by {k} x {n}) {shortfall}; "
                         f"use fewer --tokens, "
                         f"e.g. --tokens {CPU_TOKENS if config.device == 'cpu' else GPU_TOKENS}")


def _shape(config: Config) -> Any:
    from ...compose.model import from_hf_config, preset

    return from_hf_config(config.model_config) if config.model_config else preset(config.model or DEFAULT_MODEL)


def backward_shapes(op: str, m: int, n: int, k: int) -> list[tuple[str, int, int, int]]:
    """Backward of y (m x n) = x (m x k) @ w (k x n): the input's gradient dy @ w^T (m x n @ n x
    k) and the weight's x^T @ dy (k x m @ m x n), both as many FLOPs as forward but other shapes
    (the weight's has the tokens as its inner dimension), which a CPU BLAS runs at other rates."""
    return [(f"{op}.dgrad", m, k, n), (f"{op}.wgrad", k, n, m)]


class _ComputeRequired(ProbeRow):
    dtype: str
    per_block: float                # times per transformer block


class ComputeRow(_ComputeRequired, total=False):
    cls: str                        # matmul | attention | memory (kernel cases; matmul before them)
    m: int
    n: int
    k: int
    flops: int                      # per matmul or attention pass
    tflops: float
    operand_gbps: float
    seq_len: int                    # attention
    head_dim: int
    heads: int
    causal: bool
    bytes: int                      # memory-bound: bytes as the composer counts them
    gbps: float


def matmul_shapes(cfg: Config) -> list[tuple[str, int, int, int, float]]:
    """(op, m, n, k, times per block) for one block plus the head; with `backward`, each
    projection's two backward matmuls after it."""
    t, h = cfg.tokens, cfg.hidden
    assert t is not None   # resolved by validate
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


def achieved_tflops(rows: list[dict[str, Any]]) -> float | None:
    """FLOP-weighted rate over the cases: total FLOPs of a step's mix over its total time."""
    flops = sum(r["flops"] * r["per_block"] for r in rows)
    time = sum(r["flops"] * r["per_block"] / (r["tflops"] * 1e12) for r in rows if r["tflops"] > 0)
    return flops / time / 1e12 if time > 0 else None


class ComputeProbe(Probe):
    name = "compute"

    def __init__(self, config: Config):
        config = _device_resolved(config)
        self.config = config
        self._kernels: dict[str, Any] = {}
        self._model: Any = None
        if config.micro_batch:
            from .kernel_cases import kernel_cases

            self._model = _shape(config)
            assert config.seq_len is not None   # validate sets both
            self._kernels = {c.op: c for c in kernel_cases(self._model, config.micro_batch, config.seq_len,
                                                           config.activation_checkpointing)}
            self._shapes = {c.op: (c.m, c.n, c.k, c.per_block) for c in self._kernels.values() if c.cls == "matmul"}
        else:
            self._shapes = {op: (m, n, k, w) for op, m, n, k, w in matmul_shapes(config)}
        self._ab: tuple[Any, Any] | None = None
        self._run: Any = None

    def unavailable_reason(self) -> str | None:
        try:
            import torch
        except ImportError:
            return "torch is not installed"
        if self.config.device == "cuda" and not torch.cuda.is_available():
            return "no CUDA device visible to torch"
        return None

    def implementation(self) -> dict[str, Any]:
        import torch

        info: dict[str, Any] = {"engine": "torch.matmul", "device": self.config.device, "dtype": self.config.dtype}
        if self.config.device == "cuda":
            info["library"] = "hipBLAS" if torch.version.hip else "cuBLAS"
            info["gpu"] = torch.cuda.get_device_name(0)
        else:
            info["library"] = "CPU BLAS"
            info["threads"] = torch.get_num_threads()
        return info

    def cases(self) -> list[Case]:
        assert self.config.dtype is not None   # resolved by validate
        esize = DTYPE_BYTES[self.config.dtype]
        out = [Case(op, (m * k + k * n + m * n) * esize, (("m", m), ("n", n), ("k", k)))
               for op, (m, n, k, _) in self._shapes.items()]
        for c in self._kernels.values():
            if c.cls == "attention":
                out.append(Case(c.op, int(c.flops), (("seq_len", c.seq_len), ("head_dim", c.head_dim))))
            elif c.cls == "memory":
                out.append(Case(c.op, int(c.bytes), ()))
        return out

    def row_fields(self, case: Case) -> dict[str, Any]:
        c = self._kernels.get(case.op)
        if c is not None and c.cls != "matmul":
            fields: dict[str, Any] = {"cls": c.cls, "dtype": self.config.dtype, "per_block": c.per_block}
            if c.cls == "attention":
                return {**fields, "flops": int(c.flops), "seq_len": c.seq_len, "head_dim": c.head_dim,
                        "heads": c.heads, "causal": c.causal}
            return {**fields, "bytes": int(c.bytes)}
        m, n, k, per_block = self._shapes[case.op]
        return {"cls": "matmul", "m": m, "n": n, "k": k, "dtype": self.config.dtype, "flops": 2 * m * n * k,
                "per_block": per_block}

    def prepare(self, case: Case) -> None:
        import torch

        assert self.config.dtype is not None   # resolved by validate
        c = self._kernels.get(case.op)
        if c is not None and c.cls != "matmul":
            from .kernel_cases import runner

            self._run = runner(c, self._model, self.config.device, self.config.dtype)
            return
        m, n, k, _ = self._shapes[case.op]
        gen = torch.Generator().manual_seed(0)
        dtype = getattr(torch, self.config.dtype)
        a = (torch.randn(m, k, generator=gen) / k ** 0.5).to(self.config.device, dtype)
        b = torch.randn(k, n, generator=gen).to(self.config.device, dtype)
        self._ab = (a, b)

    def run_once(self, case: Case) -> None:
        import torch

        if self._run is not None:
            self._run()
            return None
        assert self._ab is not None
        torch.matmul(*self._ab)
        return None

    def sync(self) -> None:
        if self.config.device == "cuda":
            import torch

            torch.cuda.synchronize()

    def timed_on(self, case: Case) -> Any:
        return "cuda" if self.config.device == "cuda" else None

    def check(self, case: Case) -> int:
        """Rows of a fresh product that disagree with float64 on the CPU beyond the dtype's rounding."""
        import torch

        if self._run is not None:
            return 0    # attention and memory-bound kernels: timed, not checked element by element
        assert self._ab is not None
        a, b = self._ab
        rows = min(4, a.shape[0])
        got = torch.matmul(a[:rows], b).double().cpu()
        want = a[:rows].double().cpu() @ b.double().cpu()
        tol = 5e-2 if self.config.dtype != "float32" else 1e-3
        bad = (got - want).abs() > tol * (want.abs() + 1)
        return int(bad.any(dim=1).sum())

    def metrics(self, case: Case, time_s: float) -> dict[str, Any]:
        c = self._kernels.get(case.op)
        if c is not None and c.cls == "attention":
            return {"tflops": c.flops / time_s / 1e12}
        if c is not None and c.cls == "memory":
            return {"gbps": c.bytes / time_s / 1e9}
        m, n, k, _ = self._shapes[case.op]
        return {"tflops": 2 * m * n * k / time_s / 1e12, "operand_gbps": case.size_bytes / time_s / 1e9}

    def release(self, case: Case) -> None:
        self._ab = None
        self._run = None

    def summarize(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        matmuls = [r for r in rows if r.get("cls", "matmul") == "matmul"]
        out = {"achieved_tflops": achieved_tflops(matmuls), "model": self.config.model, "tokens": self.config.tokens}
        if self.config.micro_batch:
            out.update(micro_batch=self.config.micro_batch, seq_len=self.config.seq_len,
                       activation_checkpointing=self.config.activation_checkpointing)
        return out


def print_report(outcome: Any, config: Config) -> None:
    from ...compose.report import format_time
    from ...core.tables import text_table
    from ...core.units import format_number

    def shape(r: dict[str, Any]) -> str:
        if r.get("cls") == "attention":
            return f"seq {r['seq_len']} x {r['heads']} heads x {r['head_dim']}{' causal' if r['causal'] else ''}"
        if r.get("cls") == "memory":
            return f"{r['bytes'] / 1e6:.1f} MB"
        return f"{r['m']} x {r['n']} x {r['k']}"

    def rate(r: dict[str, Any]) -> str:
        # Significant digits: a CPU's 0.004 TFLOP/s read "0.00" at two decimals.
        if r.get("cls") == "memory":
            return f"{format_number(r['gbps'])} GB/s"
        return f"{format_number(r['tflops'])} TFLOP/s"

    table = [(r["op"], r.get("cls", "matmul"), shape(r), format_time(r["time_us"]["p50"] * 1e-6), rate(r),
              float(r["per_block"])) for r in outcome.rows]
    print(text_table(table, headers=["kernel", "class", "shape (m x n x k)", "time p50", "rate", "per block"],
                     tablefmt="simple"))
    impl = outcome.record["implementation"]
    achieved = outcome.record["summary"]["achieved_tflops"]
    if config.micro_batch:
        print(f"# one training step's kernels at micro-batch {config.micro_batch} x {config.seq_len} tokens, "
              f"activation checkpointing {config.activation_checkpointing} (per block: how often a step runs each)")
    print(f"# {config.model} at {config.tokens} tokens, {config.dtype} on {impl.get('gpu') or config.device} "
          f"({impl['library']}): {format_number(achieved)} TFLOP/s weighted by a step's mix")
    if config.why_cpu:
        print(f"# {config.why_cpu}")
    if config.device == "cpu" and not config.tokens_given and not config.micro_batch:
        print(f"# {CPU_TOKENS} tokens per matmul (the CPU default, which reads low): --tokens sets the training shape")
    print(f"# results: {outcome.path}  (use: microbench compose --compute {outcome.path} ...)")


SPEC = ProbeSpec(
    name="compute", command=("compute",), order=70,
    help="matmul TFLOP/s at a model's shapes (cuBLAS bf16 on a GPU, CPU float32 elsewhere)",
    metrics=("tflops", "operand_gbps"), config=Config, build=lambda config, context=None: ComputeProbe(config),
    row_schema=ComputeRow, validate=validate, printer=print_report,
    sweep=SweepDefaults(warmup=2, iters=10), needs=Needs(), aliases=(),
    case_keys=("dtype",), feeds=("compute",),
    # In the suite so that every node's records carry its matmul rate: a GPU (or CPU) short of
    # its peers is what `microbench fleet` names. Three timed replays: the rate, not a sweep.
    suite=(SuiteStep("compute", ("--iters", "3", "--warmup", "1")),),
)
