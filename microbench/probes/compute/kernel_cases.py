"""The compute probe's cases at a training step's own shapes (--micro-batch, --seq-len): every
matmul the composer prices (forward and both backward shapes, the head included), attention
forward and backward (scaled_dot_product_attention: FlashAttention on a GPU), and the
memory-bound kernels (norm, rotary, residual add, the MLP's activation, the loss over the
vocabulary), each with how many of it one block (or the root) runs under the checkpointing mode.
The shapes come from compose/kernels/blocks.py, so the record names exactly the kernels a
composed step is made of and `compose --compute` reads their rates by shape."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...compose.kernels import blocks, recompute


@dataclass(frozen=True)
class KernelCase:
    op: str
    cls: str  # matmul | attention | memory
    per_block: float  # times per block and micro-batch (the root's: 1 / layers)
    m: int = 0
    n: int = 0
    k: int = 0
    flops: float = 0.0
    bytes: float = 0.0
    seq_len: int = 0
    head_dim: int = 0
    heads: int = 0
    kv_heads: int = 0
    batch: int = 0
    causal: bool = True
    pass_: str = "fwd"
    elements: int = 0  # memory-bound: elements of the tensor it reads


def kernel_cases(model: Any, micro_batch: int, seq_len: int, checkpointing: str) -> list[KernelCase]:
    mode = recompute.parse_checkpointing(checkpointing)
    fwd = blocks.block_forward(model, micro_batch, seq_len)
    again = {k.name: k.count for k in recompute.recomputed(fwd, mode)}
    root = blocks.root_forward(model, micro_batch, seq_len)
    out: dict[str, KernelCase] = {}

    def add(case: KernelCase) -> None:
        if case.op in out:
            old = out[case.op]
            out[case.op] = KernelCase(**{**old.__dict__, "per_block": old.per_block + case.per_block})
        else:
            out[case.op] = case

    for kernels, weight in ((fwd, 1.0), (root, 1.0 / model.layers)):
        for k in kernels:
            extra = again.get(k.name, 0.0) if kernels is fwd else 0.0
            if k.cls == "matmul":
                add(KernelCase(k.name, "matmul", (k.count + extra) * weight, k.m, k.n, k.k, k.flops))
                for b in blocks.backward_of(k):
                    if b.cls == "matmul":
                        add(KernelCase(b.name, "matmul", b.count * weight, b.m, b.n, b.k, b.flops, pass_="bwd"))
            elif k.cls == "attention":
                common = dict(
                    seq_len=k.seq_len,
                    head_dim=k.head_dim,
                    heads=model.heads,
                    kv_heads=model.kv_heads,
                    batch=micro_batch,
                    causal=k.causal,
                )
                add(KernelCase("attention.fwd", "attention", (1 + extra) * weight, flops=k.flops, **common))
                add(KernelCase("attention.bwd", "attention", weight, flops=2.5 * k.flops, pass_="bwd", **common))
            else:
                add(
                    KernelCase(
                        k.name,
                        "memory",
                        (k.count + extra) * weight,
                        bytes=k.bytes,
                        elements=int(k.bytes // (14 if k.name == "loss" else blocks.ACT_BYTES)),
                    )
                )
    return list(out.values())


def runner(case: KernelCase, model: Any, device: str, dtype_name: str) -> Any:
    """A callable that runs the case once on fresh operands (made here, untimed)."""
    import torch
    import torch.nn.functional as F

    dtype = getattr(torch, dtype_name)
    gen = torch.Generator().manual_seed(0)

    def rand(*size: int, grad: bool = False) -> Any:
        t = (torch.randn(*size, generator=gen) / size[-1] ** 0.5).to(device, dtype)
        return t.requires_grad_() if grad else t

    if case.cls == "attention":
        b, s, d = case.batch, case.seq_len, case.head_dim
        q = rand(b, case.heads, s, d, grad=True)
        k, v = rand(b, case.kv_heads, s, d, grad=True), rand(b, case.kv_heads, s, d, grad=True)
        gqa = case.kv_heads != case.heads

        def forward() -> Any:
            return F.scaled_dot_product_attention(q, k, v, is_causal=case.causal, enable_gqa=gqa)

        if case.pass_ == "fwd":

            def run() -> None:
                with torch.no_grad():
                    forward()

            return run
        out, grad = forward(), rand(b, case.heads, s, d)

        def run_bwd() -> None:
            torch.autograd.grad(out, (q, k, v), grad, retain_graph=True)

        return run_bwd
    tokens = case.elements
    width = {
        "norm": model.hidden,
        "residual": model.hidden,
        "embedding": model.hidden,
        "positions": model.hidden,
        "rotary": None,
        "qk_norm": None,
        "swiglu": model.ffn,
        "gelu": model.ffn,
        "loss": model.vocab,
    }
    # rows: the tensor's first dimension, from the elements the composer counts for the op
    moved = {
        "norm": 2,
        "qk_norm": 2,
        "rotary": 2,
        "residual": 3,
        "embedding": 2,
        "positions": 3,
        "swiglu": 3,
        "gelu": 2,
        "loss": 1,
    }.get(case.op, 2)
    cols = width.get(case.op) or (model.heads + model.kv_heads) * model.head_dim
    rows = max(1, tokens // (moved * cols))
    if case.op in ("norm", "qk_norm"):
        x, w = rand(rows, cols), torch.ones(cols, device=device, dtype=dtype)
        if getattr(model, "gelu_mlp", False):
            return lambda: F.layer_norm(x, (cols,), w, w)
        return lambda: F.rms_norm(x, (cols,), w)
    if case.op == "rotary":
        x, c = rand(rows, cols), rand(1, cols)
        return lambda: x * c + x.roll(1, dims=-1) * c
    if case.op in ("residual", "positions"):
        a, b2 = rand(rows, cols), rand(rows, cols)
        return lambda: a + b2
    if case.op == "swiglu":
        a, b2 = rand(rows, cols), rand(rows, cols)
        return lambda: F.silu(a) * b2
    if case.op == "gelu":
        x = rand(rows, cols)
        return lambda: F.gelu(x)
    if case.op == "embedding":
        table = rand(model.vocab, cols)
        ids = torch.randint(0, model.vocab, (rows,), generator=gen).to(device)
        return lambda: F.embedding(ids, table)
    if case.op == "loss":
        logits = rand(rows, cols)
        target = torch.randint(0, cols, (rows,), generator=gen).to(device)
        return lambda: F.cross_entropy(logits.float(), target)
    x = rand(rows, cols)
    return lambda: x * 2
