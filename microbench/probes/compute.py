"""Matmul throughput at a model's own shapes: the FLOP rate the composer should use.

Per transformer block the cases are the four projections FSDP's compute is made of, with T
tokens: QKV (T x h @ h x (q + 2 kv)), attention output (T x q @ q x h), the gated MLP's
gate+up (T x h @ h x 2f) and down (T x f @ f x h), and the output head (T x h @ h x vocab).
A mixture of experts runs gate+up and down per expert on the tokens routed to it, T x top-k /
experts on average, so small-matmul efficiency is measured too. FLOPs per matmul 2 m n k;
achieved TFLOP/s = FLOPs / the slowest rank's median time (one process here). The summary's
`achieved_tflops` weights each case by how often a step runs it (experts x the expert cases,
1/layers for the head). Attention's own QK^T and AV (flash attention) are not timed here; the
composer assumes the same rate for them.

On a GPU: torch.matmul in bfloat16 (cuBLAS, or hipBLAS on ROCm). Without one: float32 on the
CPU, which says what this machine does, not what a GPU would.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..probe import Capabilities, Case, Probe
from ..registry import Needs, ProbeSpec, SuiteStep
from ..units import DTYPE_BYTES
from ..results.schema import ProbeRow


@dataclass
class Config:
    model: str                       # name, for the record
    hidden: int
    q_dim: int
    kv_dim: int
    ffn: int
    vocab: int
    layers: int
    experts: int = 1
    top_k: int = 1
    tokens: int = 4096
    device: str = "cpu"              # cpu | cuda
    dtype: str = "float32"


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
    """(op, m, n, k, times per block) for one block plus the head."""
    t, h = cfg.tokens, cfg.hidden
    expert_tokens = max(1, round(t * cfg.top_k / cfg.experts)) if cfg.experts > 1 else t
    return [
        ("qkv", t, cfg.q_dim + 2 * cfg.kv_dim, h, 1.0),
        ("attn_out", t, h, cfg.q_dim, 1.0),
        ("mlp_gate_up", expert_tokens, 2 * cfg.ffn, h, float(cfg.experts)),
        ("mlp_down", expert_tokens, h, cfg.ffn, float(cfg.experts)),
        ("head", t, cfg.vocab, h, 1.0 / cfg.layers),
    ]


def achieved_tflops(rows: list[dict[str, Any]]) -> float | None:
    """FLOP-weighted rate over the cases: total FLOPs of a step's mix over its total time."""
    flops = sum(r["flops"] * r["per_block"] for r in rows)
    time = sum(r["flops"] * r["per_block"] / (r["tflops"] * 1e12) for r in rows if r["tflops"] > 0)
    return flops / time / 1e12 if time > 0 else None


class ComputeProbe(Probe):
    name = "compute"
    capabilities = Capabilities()

    def __init__(self, config: Config):
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


SPEC = ProbeSpec(
    name="compute", command=("compute",), order=70,
    help="matmul TFLOP/s at a model's shapes (cuBLAS bf16 on a GPU, CPU float32 elsewhere)",
    metrics=("tflops", "operand_gbps"), config=Config, build=lambda config, context=None: ComputeProbe(config),
    row_schema=ComputeRow,
    cli="microbench.commands.compute", needs=Needs(), aliases=(),
    case_keys=("dtype",), feeds=("compute",),
    suite=(),
)
