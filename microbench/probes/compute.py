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
the cases; the composer assumes the same rate for them. `StepReplay` runs all of a dense step's
kernels, attention included, forward and backward, in step order (what `verify` predicts from).

On a GPU: torch.matmul in bfloat16 (cuBLAS, or hipBLAS on ROCm). Without one: float32 on the
CPU, which says what this machine does, not what a GPU would.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any

from ..core.errors import ProbeUnavailable, UsageError
from ..core.options import option, positive_int
from ..core.probe import Case, Probe
from ..core.registry import Needs, ProbeSpec, SuiteStep, SweepDefaults
from ..core.units import DTYPE_BYTES
from ..results.schema import ProbeRow


# A CPU takes seconds per matmul at 4096 tokens. 256 reads low (here, a shared 2-core VM: 39 GFLOP/s
# at 256 rows vs 55 at 2048 for a 4096 x 4096 weight), so --tokens with the real shape is better.
CPU_TOKENS = 256
GPU_TOKENS = 4096


@dataclass
class Config:
    model: str = option("llama-3.1-8b", help="a composer preset whose shapes to time")
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
    # Why a CPU is timed (no GPU visible), for the printout; and whether --tokens was given.
    why_cpu: str | None = field(default=None, metadata={"record": False})
    tokens_given: bool = field(default=True, metadata={"record": False})


def _device_resolved(config: Config) -> Config:
    """A Config built by a library caller (verify, a benchmark) without validate: "auto" and a
    missing dtype resolve as the command resolves them."""
    if config.device != "auto" and config.dtype is not None:
        return config
    from ..world.backends import cuda_usable

    device = config.device if config.device != "auto" else ("cuda" if cuda_usable() else "cpu")
    return replace(config, device=device, dtype=config.dtype or ("bfloat16" if device == "cuda" else "float32"))


def validate(config: Config) -> Config:
    """Shapes from the preset or config.json, the device torch sees, its dtype and token count."""
    from ..compose.models import CrudeModel, from_hf_config, preset

    shape = from_hf_config(config.model_config) if config.model_config else preset(config.model)
    if isinstance(shape, CrudeModel):  # pragma: no cover - presets always have shapes
        raise UsageError("compute needs real shapes: --model NAME or --model-config FILE")
    try:
        import torch  # noqa: F401
    except ImportError:
        raise ProbeUnavailable("compute: torch is not installed") from None
    from ..world.backends import cuda_usable

    if config.device == "cuda" and not cuda_usable():
        raise ProbeUnavailable("compute: --device cuda but no CUDA device is visible to torch")
    resolved = _device_resolved(config)   # device and dtype, as a library caller gets them
    why_cpu = ("no CUDA device visible to torch: timing the CPU in float32"
               if config.device == "auto" and resolved.device == "cpu" else None)
    tokens = config.tokens or (GPU_TOKENS if resolved.device == "cuda" else CPU_TOKENS)
    return replace(resolved, model=shape.name, hidden=shape.hidden, q_dim=shape.heads * shape.head_dim,
                   kv_dim=shape.kv_heads * shape.head_dim, ffn=shape.ffn, vocab=shape.vocab, layers=shape.layers,
                   experts=shape.experts, top_k=shape.top_k, tokens=tokens, why_cpu=why_cpu,
                   tokens_given=config.tokens is not None)


def backward_shapes(op: str, m: int, n: int, k: int) -> list[tuple[str, int, int, int]]:
    """Backward of y (m x n) = x (m x k) @ w (k x n): the input's gradient dy @ w^T (m x n @ n x
    k) and the weight's x^T @ dy (k x m @ m x n), both as many FLOPs as forward but other shapes
    (the weight's has the tokens as its inner dimension), which a CPU BLAS runs at other rates."""
    return [(f"{op}.dgrad", m, k, n), (f"{op}.wgrad", k, n, m)]


class ComputeRow(ProbeRow):
    m: int
    n: int
    k: int
    dtype: str
    flops: int                      # per matmul
    per_block: float                # times per transformer block
    tflops: float
    operand_gbps: float


def matmul_shapes(cfg: Config) -> list[tuple[str, int, int, int, float]]:
    """(op, m, n, k, times per block) for one block plus the head; with `backward`, each
    projection's two backward matmuls after it."""
    t, h = cfg.tokens, cfg.hidden
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
        self._shapes = {op: (m, n, k, w) for op, m, n, k, w in matmul_shapes(config)}
        self._ab: tuple[Any, Any] | None = None

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
        esize = DTYPE_BYTES[self.config.dtype]
        return [Case(op, (m * k + k * n + m * n) * esize, (("m", m), ("n", n), ("k", k)))
                for op, (m, n, k, _) in self._shapes.items()]

    def row_fields(self, case: Case) -> dict[str, Any]:
        m, n, k, per_block = self._shapes[case.op]
        return {"m": m, "n": n, "k": k, "dtype": self.config.dtype, "flops": 2 * m * n * k, "per_block": per_block}

    def prepare(self, case: Case) -> None:
        import torch

        m, n, k, _ = self._shapes[case.op]
        gen = torch.Generator().manual_seed(0)
        dtype = getattr(torch, self.config.dtype)
        a = (torch.randn(m, k, generator=gen) / k ** 0.5).to(self.config.device, dtype)
        b = torch.randn(k, n, generator=gen).to(self.config.device, dtype)
        self._ab = (a, b)

    def run_once(self, case: Case) -> None:
        import torch

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

        assert self._ab is not None
        a, b = self._ab
        rows = min(4, a.shape[0])
        got = torch.matmul(a[:rows], b).double().cpu()
        want = a[:rows].double().cpu() @ b.double().cpu()
        tol = 5e-2 if self.config.dtype != "float32" else 1e-3
        bad = (got - want).abs() > tol * (want.abs() + 1)
        return int(bad.any(dim=1).sum())

    def metrics(self, case: Case, time_s: float) -> dict[str, Any]:
        m, n, k, _ = self._shapes[case.op]
        return {"tflops": 2 * m * n * k / time_s / 1e12, "operand_gbps": case.size_bytes / time_s / 1e9}

    def release(self, case: Case) -> None:
        self._ab = None

    def summarize(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        return {"achieved_tflops": achieved_tflops(rows), "model": self.config.model, "tokens": self.config.tokens}


class StepReplay:
    """The compute of one training step of a dense decoder, kernel by kernel at its own shapes,
    without the model: per block QKV, causal attention (scaled_dot_product_attention with the
    block's heads and kv heads), the output projection, gate+up and down, in forward; then the
    head and the blocks in reverse with each projection's two backward matmuls and attention's
    backward. Every block has its own operands, as a model's layers do.

    What it leaves out (norms, activations, residual adds, the embedding, the loss, autograd's
    bookkeeping) is what `verify`'s calibrated compute efficiency measures, on a model of its
    own. Timed like a training step: from a barrier to the slowest rank's end, every rank at
    once (ranks share a CPU's cores and memory in training, so a lone rank's rate is not theirs).
    """

    def __init__(self, cfg: Config, heads: int, kv_heads: int):
        cfg = _device_resolved(cfg)
        import torch

        if cfg.experts > 1:
            raise ValueError("the step replay covers dense models")
        self.cfg, self.heads, self.kv_heads = cfg, heads, kv_heads
        dtype = getattr(torch, cfg.dtype)
        gen = torch.Generator().manual_seed(0)

        def rand(*size: int) -> Any:
            return (torch.randn(*size, generator=gen) / size[-1] ** 0.5).to(cfg.device, dtype)

        shapes = [s for s in matmul_shapes(Config(**{**cfg.__dict__, "backward": False})) if s[0] != "head"]
        self.layers = []
        for _ in range(cfg.layers):
            ops = []
            for op, m, n, k, _w in shapes:
                ops.append((op, rand(m, k), rand(k, n), rand(m, n)))   # x, w, dy
            self.layers.append(ops)
        t, h = cfg.tokens, cfg.hidden
        self.head = (rand(t, h), rand(h, cfg.vocab), rand(t, cfg.vocab))
        hd = cfg.q_dim // heads
        self.attn = [(rand(1, heads, t, hd), rand(1, kv_heads, t, hd), rand(1, kv_heads, t, hd), rand(1, heads, t, hd))
                     for _ in range(cfg.layers)]

    def run(self) -> None:
        import torch
        import torch.nn.functional as F

        gqa = self.kv_heads != self.heads
        outs = []
        for ops, (q, k, v, _do) in zip(self.layers, self.attn):
            for op, x, w, _dy in ops:
                with torch.no_grad():
                    torch.matmul(x, w)
                if op == "qkv":
                    q, k, v = (a.detach().requires_grad_() for a in (q, k, v))
                    outs.append(F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa))
        with torch.no_grad():
            x, w, dy = self.head
            for a, b in ((x, w), (dy, w.t()), (x.t(), dy)):
                torch.matmul(a, b)
        for layer in range(len(self.layers) - 1, -1, -1):
            for op, x, w, dy in reversed(self.layers[layer]):
                with torch.no_grad():
                    torch.matmul(dy, w.t())
                    torch.matmul(x.t(), dy)
                if op == "attn_out":
                    outs[layer].backward(self.attn[layer][3])
        self.sync()

    def sync(self) -> None:
        if self.cfg.device == "cuda":
            import torch

            torch.cuda.synchronize()

    def time_once(self, world: Any = None) -> float:
        """One replay from a barrier; the slowest rank's seconds (this rank's without a world)."""
        if world is not None:
            world.barrier()
        start = time.perf_counter()
        self.run()
        elapsed = time.perf_counter() - start
        return max(world.all_gather_object(elapsed)) if world is not None else elapsed


def print_report(outcome: Any, config: Config) -> None:
    from tabulate import tabulate

    from ..compose.report import format_time

    table = [(r["op"], r["m"], r["n"], r["k"], format_time(r["time_us"]["p50"] * 1e-6), f"{r['tflops']:.2f}",
              f"{r['per_block']:g}") for r in outcome.rows]
    print(tabulate(table, headers=["matmul", "m", "n", "k", "time p50", "TFLOP/s", "per block"], tablefmt="simple",
                   disable_numparse=True))
    impl = outcome.record["implementation"]
    achieved = outcome.record["summary"]["achieved_tflops"]
    print(f"# {config.model} at {config.tokens} tokens, {config.dtype} on {impl.get('gpu') or config.device} "
          f"({impl['library']}): {achieved:.2f} TFLOP/s weighted by a step's mix")
    if config.why_cpu:
        print(f"# {config.why_cpu}")
    if config.device == "cpu" and not config.tokens_given:
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
