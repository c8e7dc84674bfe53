"""The kernels one training step runs, per transformer block and for the root unit, at their own
shapes: what `pricing.py` prices and the compute probe times.

A kernel is a matmul (m x k @ k x n), an attention pass (SDPA / FlashAttention at its sequence
length, heads, head dim, causal or windowed), or memory-bound work priced by the bytes it moves
(norms, activations, rotary, residual adds, the loss over the vocabulary, FSDP's per-unit
copies). Forward kernels are listed in the order a block runs them; `backward_of` gives each
one's backward; `recompute.py` picks what a checkpointing mode runs again.

Bytes count the tensors an eager PyTorch kernel reads and writes once each, 2 bytes per element
of a bf16 activation (fp32 where the loss upcasts). torch.compile fuses some of these (a norm
with its residual add): the eager count is the upper bound and what an uncompiled run moves.

Two layouts: the Llama family (`ModelShape`: separate q, k, v projections, rotary, RMS norms,
a gated SiLU MLP or top-k experts) and the GPT/MPT family (`model.gpt.GptShape`: one fused
QKV projection, LayerNorm, a plain GELU MLP, biases, learned positions).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

ACT_BYTES = 2  # bf16 activations


@dataclass(frozen=True)
class Kernel:
    name: str
    cls: str  # "matmul" | "attention" | "memory"
    flops: float = 0.0
    bytes: float = 0.0
    m: int = 0
    n: int = 0
    k: int = 0
    seq_len: int = 0
    head_dim: int = 0
    causal: bool = True
    op: str = ""  # the aten op a checkpointing policy sees: mm, addmm, grouped_mm, sdpa, ...
    pass_: str = "fwd"  # fwd | bwd | recompute
    count: float = 1.0  # how many of it per block (experts), or the share of blocks that recompute
    bwd_factor: float = 1.0  # memory-bound: backward bytes / forward bytes

    @property
    def total_flops(self) -> float:
        return self.flops * self.count

    @property
    def total_bytes(self) -> float:
        return self.bytes * self.count


def matmul(name: str, m: int, n: int, k: int, bias: bool = False, count: float = 1.0, op: str = "") -> Kernel:
    return Kernel(
        name, "matmul", flops=2.0 * m * n * k, m=m, n=n, k=k, count=count, op=op or ("addmm" if bias else "mm")
    )


def memory(name: str, elements_moved: float, bwd_factor: float, dtype_bytes: int = ACT_BYTES) -> Kernel:
    return Kernel(name, "memory", bytes=elements_moved * dtype_bytes, op="elementwise", bwd_factor=bwd_factor)


def is_gpt(model: Any) -> bool:
    return bool(getattr(model, "gelu_mlp", False))


def attention_keys(model: Any, seq_len: int) -> tuple[float, int, bool]:
    """(average keys a query sees, the sequence the kernel's rate is read at, causal): s/2 under
    a causal mask; w (1 - w/2s) on sliding-window layers, averaged over the layers."""
    s = seq_len
    window, sliding = getattr(model, "sliding_window", 0), getattr(model, "sliding_layers", 0)
    if window and window < s and sliding:
        local = window * (1 - window / (2 * s))
        keys = (sliding * local + (model.layers - sliding) * s / 2) / model.layers
        return keys, s, True
    return s / 2, s, True


def block_forward(model: Any, micro_batch: int, seq_len: int) -> list[Kernel]:
    """One block's forward for one micro-batch of micro_batch x seq_len tokens, in run order."""
    t, h = micro_batch * seq_len, model.hidden
    q, kv, f = model.heads * model.head_dim, model.kv_heads * model.head_dim, model.ffn
    keys, rate_seq, causal = attention_keys(model, seq_len)
    attn = Kernel(
        "attention",
        "attention",
        flops=4.0 * t * keys * q,
        seq_len=rate_seq,
        head_dim=model.head_dim,
        causal=causal,
        op="sdpa",
        bytes=ACT_BYTES * t * (2 * q + 2 * kv),
    )
    if is_gpt(model):
        bias = model.linear_bias
        return [
            memory("norm", 2 * t * h, 1.5),
            matmul("qkv", t, q + 2 * kv, h, bias),
            attn,
            matmul("attn_out", t, h, q, bias),
            memory("residual", 3 * t * h, 1.0),
            memory("norm", 2 * t * h, 1.5),
            matmul("mlp_up", t, f, h, bias),
            memory("gelu", 2 * t * f, 1.5),
            matmul("mlp_down", t, h, f, bias),
            memory("residual", 3 * t * h, 1.0),
        ]
    out = [
        memory("norm", 2 * t * h, 1.5),
        matmul("q", t, q, h, model.qkv_bias),
        matmul("k", t, kv, h, model.qkv_bias),
        matmul("v", t, kv, h, model.qkv_bias),
    ]
    if getattr(model, "qk_norm", False):
        out.append(memory("qk_norm", 2 * t * (q + kv), 1.5))
    out += [
        memory("rotary", 2 * t * (q + kv), 1.0),
        attn,
        matmul("attn_out", t, h, q, model.mlp_bias),
        memory("residual", 3 * t * h, 1.0),
    ]
    out += [memory("norm", 2 * t * h, 1.5)] * (model.norms_per_block - 1)
    experts, top_k = model.experts, model.top_k
    if experts > 1:
        routed = max(1, round(t * top_k / experts))
        out += [
            matmul("router", t, experts, h),
            matmul("mlp_gate", routed, f, h, model.mlp_bias, experts, "grouped_mm"),
            matmul("mlp_up", routed, f, h, model.mlp_bias, experts, "grouped_mm"),
            memory("swiglu", 3 * t * top_k * f, 5 / 3),
            matmul("mlp_down", routed, h, f, model.mlp_bias, experts, "grouped_mm"),
        ]
    else:
        out += [
            matmul("mlp_gate", t, f, h, model.mlp_bias),
            matmul("mlp_up", t, f, h, model.mlp_bias),
            memory("swiglu", 3 * t * f, 5 / 3),
            matmul("mlp_down", t, h, f, model.mlp_bias),
        ]
    out.append(memory("residual", 3 * t * h, 1.0))
    return out


def backward_of(kernel: Kernel, bias_grad: bool = True) -> list[Kernel]:
    """A matmul's backward is two matmuls of its FLOPs at other shapes: the input's gradient dy @
    w^T (m x n @ n x k) and the weight's, computed as dy^T @ x (n x m @ m x k, the tokens as its
    inner dimension: autograd writes it in the layout of the linear's transposed weight, as the
    eager count shows), plus the bias gradient (a reduction over the tokens of dy) when it has
    one and `bias_grad` (the eager count lists it with the memory-bound work otherwise).
    Attention's backward is FlashAttention's: 2.5x the forward FLOPs (five matmuls to two),
    at its own rate. A memory-bound kernel moves bwd_factor x its forward bytes."""
    if kernel.cls == "matmul":
        out = [
            replace(kernel, name=f"{kernel.name}.dgrad", m=kernel.m, n=kernel.k, k=kernel.n, pass_="bwd"),
            replace(kernel, name=f"{kernel.name}.wgrad", m=kernel.n, n=kernel.k, k=kernel.m, pass_="bwd"),
        ]
        if kernel.op == "addmm" and bias_grad:
            out.append(
                replace(memory(f"{kernel.name}.bias_grad", kernel.m * kernel.n, 1.0), count=kernel.count, pass_="bwd")
            )
        return out
    if kernel.cls == "attention":
        return [replace(kernel, name="attention.bwd", flops=2.5 * kernel.flops, bytes=2 * kernel.bytes, pass_="bwd")]
    return [replace(kernel, name=f"{kernel.name}.bwd", bytes=kernel.bytes * kernel.bwd_factor, pass_="bwd")]


LOSSES = ("eager", "fused")


def loss_kernel(tokens: int, vocab: int, loss: str = "eager") -> Kernel:
    """The loss over the vocabulary, bytes per logit:
    eager  F.cross_entropy on upcast logits: bf16 read, fp32 copy written (6), log-softmax
           reads and writes fp32 (8); backward 22;
    fused  one kernel that reads the bf16 logits and keeps fp32 inside (flash-attn's
           xentropy, llm-foundry's `fused_crossentropy`, the default of its MPT models):
           2 forward; backward reads the logits and writes their gradient, 4."""
    if loss == "fused":
        return Kernel("loss", "memory", bytes=2.0 * tokens * vocab, op="elementwise", bwd_factor=2.0)
    return Kernel("loss", "memory", bytes=14.0 * tokens * vocab, op="elementwise", bwd_factor=22 / 14)


def root_forward(model: Any, micro_batch: int, seq_len: int, loss: str = "eager") -> list[Kernel]:
    """The root unit: the embedding lookup (and learned positions), the final norm, the head's
    matmul over the vocabulary and the loss (`loss_kernel`)."""
    t, h, v = micro_batch * seq_len, model.hidden, model.vocab
    out = [memory("embedding", 2 * t * h, 1.5)]
    if getattr(model, "positions", 0):
        out.append(memory("positions", 3 * t * h, 1.0))
    out += [memory("norm", 2 * t * h, 1.5), matmul("head", t, v, h), loss_kernel(t, v, loss)]
    return out


def root_backward(model: Any, forward: list[Kernel]) -> list[Kernel]:
    out = [k for kernel in reversed(forward) for k in backward_of(kernel)]
    # The embedding's gradient is a dense vocab x hidden tensor zeroed every micro-batch.
    out.append(replace(memory("embedding.grad_zero", model.vocab * model.hidden, 1.0), pass_="bwd"))
    return out


def fsdp_copies(unit_params: float, param_bytes: int, reduce_bytes: int, reshard: bool) -> tuple[Kernel, Kernel]:
    """FSDP2's own copies per unit per micro-batch, memory-bound on the GPU: forward, the
    all-gather's output split into the parameters (read and write the unsharded unit); backward,
    that copy again when the unit was resharded, and the gradients copied (and cast to the
    reduce dtype) into the reduce-scatter's input."""
    fwd = Kernel("fsdp_copy_out", "memory", bytes=2.0 * unit_params * param_bytes, op="fsdp")
    bwd = Kernel(
        "fsdp_copy_in",
        "memory",
        pass_="bwd",
        op="fsdp",
        bytes=unit_params * ((2.0 * param_bytes if reshard else 0.0) + param_bytes + reduce_bytes),
    )
    return fwd, bwd
