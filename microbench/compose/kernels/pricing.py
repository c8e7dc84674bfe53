"""Each kernel of a step priced at the rate of its own class and shape, and the per-block and
root times the FSDP step model (fsdp.py) overlaps with communication.

Rates come, per kernel, from (in order) a `microbench compute` record measured on the user's
GPU at that kernel's shape, the same record's rate for that kernel at another shape (said so),
the shipped table for the GPU (tables.py), or a flat FLOP rate (--tflops, peak x --mfu) with
memory-bound work at the GPU's bandwidth. A calibration's `scale` multiplies every rate: it is
what one measured step says the described kernels missed (communication is not scaled).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from . import eager
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
        return {
            "class": self.cls,
            "pass": self.pass_,
            "time_s": self.time_s,
            "flops": self.flops,
            "bytes": self.bytes,
            "rate": self.rate,
            "rate_unit": "FLOP/s" if self.cls in ("matmul", "attention") else "B/s",
            "source": "; ".join(sorted(self.sources)),
        }


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
    memory_from: tuple[str, ...] = ()   # where the memory-bound kernels' bytes came from, per unit

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


def _from_count(counted: eager.Counted, pass_: str, compute: list[Kernel]) -> list[Kernel]:
    """A counted pass as kernels: its matmuls are the listed ones of the same (m, n, k) (their
    names and ops), attention the listed attention, memory-bound work the counted bytes."""
    by_shape = {(k.m, k.n, k.k): k for k in compute if k.cls == "matmul"}
    attention = [k for k in compute if k.cls == "attention"]
    out = []
    for op in counted.passes[pass_]:
        if op.cls == "matmul":
            m, n, k = op.mnk
            out.append(by_shape.get(op.mnk) or Kernel(f"matmul {m}x{n}x{k}", "matmul", flops=2.0 * m * n * k,
                                                       m=m, n=n, k=k, op="mm"))
        elif op.cls == "attention":
            out.extend(attention)
        else:
            assert op.kernel is not None   # a memory-bound op carries its kernel
            out.append(op.kernel)
    return out


def block_kernels(model: Any, micro_batch: int, seq_len: int, mode: Checkpointing, precision: str = "bf16",
                  attention_call: str = "sdpa", early_stop: bool = True,
                  counted_ops: bool = True) -> tuple[list[Kernel], list[Kernel], list[Kernel], str]:
    """(forward, backward, recompute, where the memory-bound bytes came from) for one block. The
    matmuls and attention are blocks.py's; memory-bound work and what a checkpointing mode runs
    again are the eager count's where it covers the layout (eager.py) and `counted_ops`, else
    blocks.py's list."""
    fwd = block_forward(model, micro_batch, seq_len)
    counted = eager.counted_block(model, micro_batch, seq_len, precision, attention_call) if counted_ops else None
    if counted is None:
        return fwd, [b for k in reversed(fwd) for b in backward_of(k)], recomputed(fwd, mode), "hand-listed"
    compute = [k for k in fwd if k.cls != "memory"]
    bwd = [b for k in reversed(compute) for b in backward_of(k, bias_grad=False)] + counted.memory("bwd")
    again: list[Kernel] = []
    if mode.recomputes:
        key = f"recompute_{'ops' if mode.mode == 'ops' else 'full'}{'' if early_stop else '_no_early_stop'}"
        weight = mode.fraction if mode.mode == "blocks" else 1.0
        again = [replace(k, pass_="recompute", count=k.count * weight) for k in _from_count(counted, key, compute)]
    return compute + counted.memory("fwd"), bwd, again, f"counted {counted.signature}"


def root_kernels(model: Any, micro_batch: int, seq_len: int, loss: str, precision: str = "bf16",
                 counted_ops: bool = True) -> tuple[list[Kernel], list[Kernel], str]:
    rfwd = root_forward(model, micro_batch, seq_len, loss)
    counted = eager.counted_root(model, micro_batch, seq_len, precision, loss) if counted_ops else None
    if counted is None:
        return rfwd, root_backward(model, rfwd), "hand-listed"
    compute = [k for k in rfwd if k.cls != "memory"]
    bwd = [b for k in reversed(compute) for b in backward_of(k, bias_grad=False)] + counted.memory("bwd")
    return compute + counted.memory("fwd"), bwd, f"counted {counted.signature}"


def price_step(model: Any, micro_batch: int, seq_len: int, grad_accum: int, checkpointing: Checkpointing,
               rates: Rates, *, param_bytes: int = 2, reduce_bytes: int = 2, reshard: bool = True,
               scale: float = 1.0, loss: str = "eager", precision: str = "bf16", attention_call: str = "sdpa",
               early_stop: bool = True, counted_ops: bool = True) -> StepCompute:
    """Every kernel of one optimizer step on one rank, priced; per-micro-batch unit times for the
    overlap model. The FSDP copies ride with the unit they belong to."""
    fwd, bwd, again, block_from = block_kernels(model, micro_batch, seq_len, checkpointing, precision,
                                                attention_call, early_stop, counted_ops)
    copy_out, copy_in = fsdp_copies(model.block_params, param_bytes, reduce_bytes, reshard)
    rfwd, rbwd, root_from = root_kernels(model, micro_batch, seq_len, loss, precision, counted_ops)
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
    return StepCompute(block_fwd, block_bwd, root_fwd, root_bwd, ordered, checkpointing.label, flops,
                       (f"blocks: {block_from}", f"root: {root_from}"))


def model_flops_per_token(model: Any, seq_len: int) -> float:
    """Training FLOPs per token without recompute: 6 x the matmuls' weights a token touches plus
    attention's QK^T and AV forward and backward (3 x the forward, as MFU counts them)."""
    fwd = block_forward(model, 1, seq_len)
    block = sum(k.total_flops for k in fwd)
    head = 2.0 * model.vocab * model.hidden * seq_len
    return 3 * (model.layers * block + head) / seq_len
