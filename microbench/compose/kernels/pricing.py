"""Each kernel of a step priced at the rate of its own class and shape, and the per-block and
root times the FSDP step model (fsdp.py) overlaps with communication.

Rates come, per kernel, from (in order) a `microbench compute` record measured on the user's
GPU at that kernel's shape, the same record's rate for that kernel at another shape (said so),
the shipped table for the GPU (tables.py), or a flat FLOP rate (--tflops, peak x --mfu) with
memory-bound work at the GPU's bandwidth. A calibration's `scale` multiplies every rate: it is
what one measured step says the described kernels missed (communication is not scaled).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from .blocks import Kernel, backward_of, block_forward, fsdp_copies, root_backward, root_forward
from .recompute import Checkpointing, recomputed

CLASSES = ("matmul", "attention", "memory")


class Rates(Protocol):
    def rate(self, kernel: Kernel) -> tuple[float, str]:
        """(FLOP/s for matmul and attention, or bytes/s for memory-bound, and its source)."""


@dataclass(frozen=True)
class TableRates:
    table: Any                 # tables.KernelTable
    memory_gbps: float         # the GPU's peak bandwidth (an H200 reads H100's compute table)
    attention_impl: str | None = None   # None: the table's default implementation

    def attention_source(self) -> str:
        t, asked = self.table, self.attention_impl
        used = t.attention_impl(asked).name
        if t.has_attention(asked):
            return f"table {t.gpu} attention {used}"
        return f"table {t.gpu} attention {used} ({asked}: no {t.gpu} figure in the table)"

    def rate(self, kernel: Kernel) -> tuple[float, str]:
        t = self.table
        if kernel.cls == "matmul":
            return t.matmul(kernel.m, kernel.n, kernel.k) * 1e12, f"table {t.gpu} matmul"
        if kernel.cls == "attention":
            bwd = kernel.pass_ == "bwd"
            return (t.attention(kernel.seq_len, kernel.head_dim, kernel.causal, bwd, self.attention_impl) * 1e12,
                    f"{self.attention_source()} {'bwd' if bwd else 'fwd'}")
        return self.memory_gbps * t.memory_fraction * 1e9, f"table {t.gpu} memory {t.memory_fraction:.3g} x peak"


@dataclass(frozen=True)
class FlatRates:
    """One FLOP rate for matmuls and attention (the composer before per-kernel pricing), and
    memory-bound work at the GPU's bandwidth, or free when no GPU is named (a CPU prediction
    whose measured rate already holds it)."""
    flops_per_s: float
    source: str
    memory_bytes_per_s: float | None = None
    memory_source: str = ""

    def rate(self, kernel: Kernel) -> tuple[float, str]:
        if kernel.cls == "memory":
            if not self.memory_bytes_per_s:
                return float("inf"), "not priced (no GPU bandwidth)"
            return self.memory_bytes_per_s, self.memory_source
        return self.flops_per_s, self.source


@dataclass
class ClassRow:
    """One line of the breakdown: a kernel class in one pass, for one optimizer step on one rank."""
    cls: str
    pass_: str
    time_s: float = 0.0
    flops: float = 0.0
    bytes: float = 0.0
    sources: set[str] = field(default_factory=set)

    @property
    def rate(self) -> float:
        """Achieved FLOP/s (matmul, attention) or bytes/s (memory) over this row."""
        if self.time_s <= 0:
            return 0.0
        return (self.flops if self.cls in ("matmul", "attention") else self.bytes) / self.time_s

    def as_dict(self) -> dict[str, Any]:
        return {"class": self.cls, "pass": self.pass_, "time_s": self.time_s, "flops": self.flops,
                "bytes": self.bytes, "rate": self.rate, "rate_unit": "FLOP/s" if self.cls in ("matmul", "attention") else "B/s",
                "source": "; ".join(sorted(self.sources))}


@dataclass(frozen=True)
class StepCompute:
    """Seconds per micro-batch: one block's forward and backward (recompute included, averaged
    over the blocks for blocks:F), the root's; and the per-class breakdown for a whole step."""
    block_fwd_s: float
    block_bwd_s: float
    root_fwd_s: float
    root_bwd_s: float
    rows: tuple[ClassRow, ...]
    checkpointing: str
    flops_per_step: float

    def times(self, scale: float = 1.0) -> dict[str, float]:
        return {"block_fwd": self.block_fwd_s / scale, "block_bwd": self.block_bwd_s / scale,
                "root_fwd": self.root_fwd_s / scale, "root_bwd": self.root_bwd_s / scale}


def _price(kernels: list[Kernel], rates: Rates, scale: float, rows: dict[tuple[str, str], ClassRow],
           weight: float) -> float:
    total = 0.0
    for k in kernels:
        rate, source = rates.rate(k)
        work = k.total_bytes if k.cls == "memory" else k.total_flops
        seconds = work / (rate * scale) if rate > 0 else float("inf")
        total += seconds
        cls = "fsdp copies" if k.op == "fsdp" else k.cls
        row = rows.setdefault((cls, k.pass_), ClassRow(cls, k.pass_))
        row.time_s += seconds * weight
        row.flops += k.total_flops * weight
        row.bytes += k.total_bytes * weight
        row.sources.add(source)
    return total


def price_step(model: Any, micro_batch: int, seq_len: int, grad_accum: int, checkpointing: Checkpointing,
               rates: Rates, *, param_bytes: int = 2, reduce_bytes: int = 2, reshard: bool = True,
               scale: float = 1.0, loss: str = "eager") -> StepCompute:
    """Every kernel of one optimizer step on one rank, priced; per-micro-batch unit times for the
    overlap model. The FSDP copies ride with the unit they belong to."""
    fwd = block_forward(model, micro_batch, seq_len)
    bwd = [b for k in reversed(fwd) for b in backward_of(k)]
    again = recomputed(fwd, checkpointing)
    copy_out, copy_in = fsdp_copies(model.block_params, param_bytes, reduce_bytes, reshard)
    rfwd = root_forward(model, micro_batch, seq_len, loss)
    rbwd = root_backward(model, rfwd)
    root_out, root_in = fsdp_copies(model.root_params, param_bytes, reduce_bytes, False)
    rows: dict[tuple[str, str], ClassRow] = {}
    per_step = grad_accum * model.layers
    block_fwd = _price(fwd + [copy_out], rates, scale, rows, per_step)
    block_bwd = _price(again + bwd + [copy_in], rates, scale, rows, per_step)
    root_fwd = _price(rfwd + [root_out], rates, scale, rows, grad_accum)
    root_bwd = _price(rbwd + [root_in], rates, scale, rows, grad_accum)
    order = {(c, p): i for i, (c, p) in enumerate((c, p) for p in ("fwd", "recompute", "bwd")
                                                   for c in CLASSES + ("fsdp copies",))}
    ordered = tuple(sorted(rows.values(), key=lambda r: order.get((r.cls, r.pass_), 99)))
    flops = sum(r.flops for r in ordered)
    return StepCompute(block_fwd, block_bwd, root_fwd, root_bwd, ordered, checkpointing.label, flops)


def model_flops_per_token(model: Any, seq_len: int) -> float:
    """Training FLOPs per token without recompute: 6 x the matmuls' weights a token touches plus
    attention's QK^T and AV forward and backward (3 x the forward, as MFU counts them)."""
    fwd = block_forward(model, 1, seq_len)
    block = sum(k.total_flops for k in fwd)
    head = 2.0 * model.vocab * model.hidden * seq_len
    return 3 * (model.layers * block + head) / seq_len
