"""The transformer blocks and root units whose eager PyTorch ops `eager_ops.py` counts, written as
the trainers behind the composer's two layouts write them, small enough to run on a CPU:

  gpt    llm-foundry's MPTBlock (llmfoundry/models/layers/blocks.py at b2a43a147, the commit of
         the H100 benchmark table): LPLayerNorm (the benchmark script sets norm_type
         low_precision_layernorm: the norm runs in the autocast dtype with autocast off), one
         fused Wqkv linear split into q, k, v, the attention call, out_proj, a residual add, a
         second LPLayerNorm, up / GELU / down, a residual add; biases unless no_bias. Dropout at
         p=0 (every MPT yaml) is the identity in eager PyTorch and is left out.
  llama  torchtitan's Llama 3 TransformerBlock (torchtitan/models/llama3/model/model.py at
         8a749c618): nn.RMSNorm, wq / wk / wv without bias, rotary on complex numbers in fp32
         (apply_rotary_emb), repeat_kv for grouped-query heads, SDPA on (b, heads, s, d)
         transposes, wo, a residual add, RMSNorm, w2(silu(w1 x) * w3 x), a residual add.

The attention calls around the kernel, which move bytes of their own:
  sdpa              q, k, v viewed (b, s, heads, d) and transposed to (b, heads, s, d), the output
                    transposed back (torchtitan, Hugging Face models);
  llmfoundry-triton llm-foundry's triton_flash_attn_fn: (b, s, heads, d) views of the split
                    Wqkv output straight into flash_attn_triton's FlashAttnFunc;
  llmfoundry-flash  llm-foundry's flash_attn_fn (flash-attn 1.0.9 or 2.3.2): every one of q, k, v
                    unpadded by flash-attn's bert_padding.unpad_input (a gather by token index,
                    a scatter into zeros backward), the output padded back by pad_input (zeros,
                    index_put; a gather backward).

Kernels that are one CUDA call whose CPU build decomposes into many ops, or that do not exist on
a CPU, are stand-in custom ops taking and returning exactly the CUDA kernel's tensors, so the
count sees one op with that kernel's inputs and outputs:
  mbcount::attention / attention_backward  FlashAttention (the attention table prices them);
  mbcount::rms_norm / rms_norm_backward    aten._fused_rms_norm: a CUDA kernel since PyTorch's
                                           fused RMSNorm (pytorch/pytorch#153666); rstd in fp32;
  mbcount::cross_entropy / _backward       flash-attn's xentropy kernel (llm-foundry's
                                           fused_crossentropy): bf16 logits in, fp32 losses and
                                           log-sum-exp out; backward writes the logits' gradient.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


# ----------------------------------------------------------------------------- stand-in CUDA kernels

@torch.library.custom_op("mbcount::attention", mutates_args=())
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    # FlashAttention writes its output in q's (b, s, heads, d) memory order whatever the view
    return torch.empty_like(q)


@torch.library.custom_op("mbcount::attention_backward", mutates_args=())
def attention_backward(grad: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _attention_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs, output)


def _attention_bwd(ctx, grad):
    q, k, v, out = ctx.saved_tensors
    return attention_backward(grad, q, k, v, out)


attention.register_autograd(_attention_bwd, setup_context=_attention_setup)


@torch.library.custom_op("mbcount::rms_norm", mutates_args=())
def rms_norm(x: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(x), x.new_empty(x.shape[:-1] + (1,), dtype=torch.float32)


@torch.library.custom_op("mbcount::rms_norm_backward", mutates_args=())
def rms_norm_backward(grad: torch.Tensor, x: torch.Tensor, rstd: torch.Tensor,
                      weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(x), torch.empty_like(weight)


def _rms_setup(ctx, inputs, output):
    # rstd is not differentiable (as aten._fused_rms_norm declares it): no zeros made for its gradient
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(inputs[0], output[1], inputs[1])


def _rms_bwd(ctx, grad, _grad_rstd):
    x, rstd, weight = ctx.saved_tensors
    return rms_norm_backward(grad, x, rstd, weight)


rms_norm.register_autograd(_rms_bwd, setup_context=_rms_setup)


@torch.library.custom_op("mbcount::cross_entropy", mutates_args=())
def cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    rows = logits.shape[0]
    return logits.new_empty(rows, dtype=torch.float32), logits.new_empty(rows, dtype=torch.float32)


@torch.library.custom_op("mbcount::cross_entropy_backward", mutates_args=())
def cross_entropy_backward(grad: torch.Tensor, logits: torch.Tensor, lse: torch.Tensor,
                           labels: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(logits)


def _xent_setup(ctx, inputs, output):
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(inputs[0], output[1], inputs[1])


def _xent_bwd(ctx, grad, _grad_lse):
    logits, lse, labels = ctx.saved_tensors
    return cross_entropy_backward(grad, logits, lse, labels), None


cross_entropy.register_autograd(_xent_bwd, setup_context=_xent_setup)


# ----------------------------------------------------------------------------- norms

class LPLayerNorm(nn.LayerNorm):
    """llm-foundry's low-precision LayerNorm: input, weight and bias cast to the autocast dtype,
    layer_norm with autocast off (llmfoundry/models/layers/norm.py)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        def down(t):
            return t.to(torch.get_autocast_dtype("cpu")) if torch.is_autocast_enabled("cpu") and t is not None else t
        with torch.autocast("cpu", enabled=False):
            return F.layer_norm(down(x), self.normalized_shape, down(self.weight), down(self.bias), self.eps)


class FusedRMSNorm(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight)[0]


# ----------------------------------------------------------------------------- flash-attn's padding

class IndexFirstAxis(torch.autograd.Function):
    """flash_attn.bert_padding.index_first_axis (v1.0.9 and v2.3.2): gather rows forward, scatter
    into zeros backward."""

    @staticmethod
    def forward(ctx, x, indices):
        ctx.save_for_backward(indices)
        ctx.first_axis_dim, other_shape = x.shape[0], x.shape[1:]
        flat = x.reshape(x.shape[0], -1)
        out = torch.gather(flat, 0, indices[:, None].expand(indices.shape[0], flat.shape[1]))
        return out.reshape(-1, *other_shape)

    @staticmethod
    def backward(ctx, grad):
        (indices,) = ctx.saved_tensors
        other_shape = grad.shape[1:]
        grad = grad.reshape(grad.shape[0], -1)
        grad_input = torch.zeros([ctx.first_axis_dim, grad.shape[1]], device=grad.device, dtype=grad.dtype)
        grad_input.scatter_(0, indices[:, None].expand(indices.shape[0], grad.shape[1]), grad)
        return grad_input.reshape(ctx.first_axis_dim, *other_shape), None


class IndexPutFirstAxis(torch.autograd.Function):
    """flash_attn.bert_padding.index_put_first_axis: zeros, index_put forward; a gather backward."""

    @staticmethod
    def forward(ctx, values, indices, first_axis_dim):
        ctx.save_for_backward(indices)
        out = torch.zeros(first_axis_dim, *values.shape[1:], device=values.device, dtype=values.dtype)
        out[indices] = values
        return out

    @staticmethod
    def backward(ctx, grad):
        (indices,) = ctx.saved_tensors
        return grad[indices], None, None


def unpad_input(x: torch.Tensor, mask: torch.Tensor):
    seqlens = mask.sum(dim=-1, dtype=torch.int32)
    indices = torch.nonzero(mask.flatten(), as_tuple=False).flatten()
    max_seqlen = seqlens.max().item()
    cu_seqlens = F.pad(torch.cumsum(seqlens, dim=0, dtype=torch.int32), (1, 0))
    return IndexFirstAxis.apply(x.reshape(-1, *x.shape[2:]), indices), indices, cu_seqlens, max_seqlen


def call_attention(call: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int, kv_heads: int,
                   mask: torch.Tensor | None = None) -> torch.Tensor:
    """q (b, s, heads x d), k and v (b, s, kv_heads x d) as the block's projections give them;
    the attention output (b, s, heads x d)."""
    b, s, _ = q.shape
    if call == "llmfoundry-flash":
        mask = torch.ones(b, s, dtype=torch.bool) if mask is None else mask
        qu, idx, _, _ = unpad_input(q, mask)
        ku, _, _, _ = unpad_input(k, mask)
        vu, _, _, _ = unpad_input(v, mask)
        qu, ku, vu = (t.view(t.shape[0], n, -1) for t, n in ((qu, heads), (ku, kv_heads), (vu, kv_heads)))
        if kv_heads < heads:
            ku, vu = (repeat_kv(t.view(b, s, kv_heads, -1), heads // kv_heads).view(b * s, heads, -1) for t in (ku, vu))
        out = attention(qu, ku, vu)
        return IndexPutFirstAxis.apply(out.reshape(out.shape[0], -1), idx, b * s).view(b, s, -1)
    q4, k4, v4 = (t.view(b, s, n, -1) for t, n in ((q, heads), (k, kv_heads), (v, kv_heads)))
    if kv_heads < heads:
        k4, v4 = repeat_kv(k4, heads // kv_heads), repeat_kv(v4, heads // kv_heads)
    if call == "llmfoundry-triton":
        return attention(q4, k4, v4).view(b, s, -1)
    if call == "sdpa":
        out = attention(q4.transpose(1, 2), k4.transpose(1, 2), v4.transpose(1, 2))
        return out.transpose(1, 2).contiguous().view(b, s, -1)
    raise ValueError(f"unknown attention call {call!r}")


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """torchtitan's and llm-foundry's repeat_kv: expand the kv heads, reshape (a copy)."""
    b, s, kvh, d = x.shape
    return x[:, :, :, None, :].expand(b, s, kvh, n_rep, d).reshape(b, s, kvh * n_rep, d)


# ----------------------------------------------------------------------------- blocks

class GptBlock(nn.Module):
    def __init__(self, hidden: int, heads: int, kv_heads: int, ffn: int, bias: bool, call: str):
        super().__init__()
        self.heads, self.kv_heads, self.call = heads, kv_heads, call
        self.head_dim = hidden // heads
        kv = kv_heads * self.head_dim
        self.norm_1 = LPLayerNorm(hidden, elementwise_affine=True, bias=bias)
        self.Wqkv = nn.Linear(hidden, hidden + 2 * kv, bias=bias)
        self.out_proj = nn.Linear(hidden, hidden, bias=bias)
        self.norm_2 = LPLayerNorm(hidden, elementwise_affine=True, bias=bias)
        self.up_proj = nn.Linear(hidden, ffn, bias=bias)
        self.down_proj = nn.Linear(ffn, hidden, bias=bias)

    def forward(self, x: torch.Tensor, extra=None) -> torch.Tensor:
        a = self.norm_1(x)
        kv = self.kv_heads * self.head_dim
        q, k, v = self.Wqkv(a).split([x.shape[-1], kv, kv], dim=2)
        x = x + self.out_proj(call_attention(self.call, q, k, v, self.heads, self.kv_heads))
        return x + self.down_proj(F.gelu(self.up_proj(self.norm_2(x))))


def apply_rotary_emb(xq: torch.Tensor, xk: torch.Tensor, freqs_cis: torch.Tensor):
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    freqs = freqs_cis[: xq.shape[1]].view(1, xq.shape[1], 1, -1)
    return torch.view_as_real(xq_ * freqs).flatten(3).type_as(xq), torch.view_as_real(xk_ * freqs).flatten(3).type_as(xk)


class LlamaBlock(nn.Module):
    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int, ffn: int, call: str):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim, self.call = heads, kv_heads, head_dim, call
        self.attention_norm, self.ffn_norm = FusedRMSNorm(hidden), FusedRMSNorm(hidden)
        self.wq = nn.Linear(hidden, heads * head_dim, bias=False)
        self.wk = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.wv = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.wo = nn.Linear(heads * head_dim, hidden, bias=False)
        self.w1 = nn.Linear(hidden, ffn, bias=False)
        self.w2 = nn.Linear(ffn, hidden, bias=False)
        self.w3 = nn.Linear(hidden, ffn, bias=False)

    def forward(self, x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        a = self.attention_norm(x)
        xq = self.wq(a).view(b, s, -1, self.head_dim)
        xk = self.wk(a).view(b, s, -1, self.head_dim)
        xv = self.wv(a)
        xq, xk = apply_rotary_emb(xq, xk, freqs_cis)
        h = x + self.wo(call_attention(self.call, xq.flatten(2), xk.flatten(2), xv, self.heads, self.kv_heads))
        m = self.ffn_norm(h)
        return h + self.w2(F.silu(self.w1(m)) * self.w3(m))


# ----------------------------------------------------------------------------- root units

def loss_of(logits: torch.Tensor, labels: torch.Tensor, loss: str) -> torch.Tensor:
    flat = logits.reshape(-1, logits.shape[-1])
    if loss == "fused":
        return cross_entropy(flat, labels.reshape(-1))[0].mean()
    # torchtitan's cross_entropy_loss: the bf16 logits upcast, then F.cross_entropy
    return F.cross_entropy(flat.float(), labels.reshape(-1))


class GptRoot(nn.Module):
    """MPTModel's embedding (wte + learned wpe), norm_f and the tied unembedding (SharedEmbedding's
    F.linear on wte.weight), then the loss; the blocks between them are counted on their own."""

    def __init__(self, hidden: int, vocab: int, positions: int, bias: bool, loss: str):
        super().__init__()
        self.wte = nn.Embedding(vocab, hidden)
        self.wpe = nn.Embedding(positions, hidden) if positions else None
        self.norm_f = LPLayerNorm(hidden, elementwise_affine=True, bias=bias)
        self.loss = loss

    def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = self.wte(ids)
        if self.wpe is not None:
            pos = torch.arange(0, ids.shape[1], dtype=torch.long).unsqueeze(0)
            x = x + self.wpe(pos)
        return loss_of(F.linear(self.norm_f(x), self.wte.weight), labels, self.loss)


class LlamaRoot(nn.Module):
    """torchtitan's tok_embeddings, final norm and untied output projection, then the loss."""

    def __init__(self, hidden: int, vocab: int, loss: str):
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab, hidden)
        self.norm = FusedRMSNorm(hidden)
        self.output = nn.Linear(hidden, vocab, bias=False)
        self.loss = loss

    def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return loss_of(self.output(self.norm(self.tok_embeddings(ids))), labels, self.loss)
