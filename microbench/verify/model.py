"""A real decoder transformer built from the composer's model description, sharded as FSDP2
shards it, and the training step a trainer times.

Built from `compose.models.ModelShape`, so its parameter count is the composer's by
construction (a test holds them equal): per block an RMS norm, attention with grouped-query
heads (one fused QKV projection of h x (q + 2 kv), causal scaled-dot-product attention, an
output projection q x h), a second RMS norm and a gated MLP (gate and up fused, h x 2f, then
down f x h); the root holds the embedding, the final norm and the head (tied or not).
`fully_shard` goes on every block, then on the root, as torchtitan does. On a GPU the
parameters are gathered in bfloat16 under a `MixedPrecisionPolicy` (gradients reduced in
bfloat16, the composer's default), on the CPU everything is float32.

Only dense text models: mixture-of-experts routing, vision towers, query/key norms and
attention sinks change the compute the composer predicts and are refused here.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from ..compose.model import ModelShape
from ..core.errors import UsageError
from ..core.units import element_size

# Small shapes the CPU can train in seconds; the names say their size. A GQA ratio of 2 and
# the llama ratio ffn ~ 2.7 h keep them the shape of the presets, only narrower.
PRESETS: dict[str, ModelShape] = {
    m.name: m
    for m in (
        ModelShape(
            "tiny", hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, ffn=176, vocab=512, source="verify preset"
        ),
        ModelShape(
            "small", hidden=256, layers=4, heads=4, kv_heads=2, head_dim=64, ffn=704, vocab=4096, source="verify preset"
        ),
        ModelShape(
            "medium",
            hidden=384,
            layers=4,
            heads=6,
            kv_heads=2,
            head_dim=64,
            ffn=1024,
            vocab=4096,
            source="verify preset",
        ),
        ModelShape(
            "calib", hidden=320, layers=3, heads=5, kv_heads=1, head_dim=64, ffn=864, vocab=4096, source="verify preset"
        ),
    )
}

FAMILY = "dense-decoder (rmsnorm, gqa sdpa, gated mlp)"


def shape_from_args(model: str | None, hidden: int | None, layers: int | None, heads: int | None,
                    vocab: int | None, kv_heads: int | None = None) -> ModelShape:
    """A verify preset, a composer preset, or explicit sizes (the rest derived as the presets do)."""
    if hidden or layers or heads or vocab:
        base = PRESETS["small"]
        h = hidden or base.hidden
        nh = heads or max(1, h // 64)
        if h % nh:
            raise UsageError(
                f"invalid --heads {nh}: the hidden size {h} must divide into heads, e.g. --heads {max(1, h // 64)}"
            )
        kv = kv_heads or max(1, nh // 2)
        if nh % kv:
            kv = 1
        ffn = 2 * (8 * h // 3 // 2)
        return ModelShape(
            f"h{h}-l{layers or base.layers}",
            hidden=h,
            layers=layers or base.layers,
            heads=nh,
            kv_heads=kv,
            head_dim=h // nh,
            ffn=ffn,
            vocab=vocab or base.vocab,
            source="--hidden/--layers/--heads/--vocab",
        )
    name = (model or "small").strip().lower()
    if name in PRESETS:
        return PRESETS[name]
    from ..compose.model import preset

    try:
        return preset(name)
    except UsageError:
        raise UsageError(f"unknown --model {model!r}: expected one of {', '.join(PRESETS)} (verify presets) or a "
                         f"composer preset, e.g. --model small") from None


def check_buildable(shape: ModelShape) -> None:
    odd = [what for what, bad in (("experts", shape.experts > 1), ("vision towers", bool(shape.towers)),
                                  ("query/key norms", shape.qk_norm), ("attention sinks", shape.attention_sinks),
                                  ("MLP biases", shape.mlp_bias), ("4 norms per block", shape.norms_per_block != 2))
           if bad]
    if odd:
        raise UsageError(f"model {shape.name!r} has {', '.join(odd)}; verify builds dense decoder transformers, "
                         f"e.g. --model small or --hidden 512 --layers 4")


@dataclass(frozen=True)
class Precision:
    param_dtype: str      # what the gathered parameters and compute use
    reduce_dtype: str     # what gradients are reduced in
    policy: str           # for the record

    @property
    def bytes(self) -> int:
        return element_size(self.param_dtype)


def precision_for(device: str) -> Precision:
    """The real code path chosen when CUDA is present: bf16 gathers and reductions under a
    MixedPrecisionPolicy, fp32 master shards. The CPU trains in float32 throughout."""
    if device == "cuda":
        return Precision("bfloat16", "bfloat16", "MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=bf16)")
    return Precision("float32", "float32", "none (float32 on the CPU)")


def build(shape: ModelShape, device: Any) -> Any:
    """The unsharded model in float32 (FSDP2 keeps fp32 shards; the policy casts gathers)."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    check_buildable(shape)
    h, hd = shape.hidden, shape.head_dim
    q_dim, kv_dim = shape.heads * hd, shape.kv_heads * hd

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attn_norm = nn.RMSNorm(h)
            self.qkv = nn.Linear(h, q_dim + 2 * kv_dim, bias=shape.qkv_bias)
            self.out = nn.Linear(q_dim, h, bias=False)
            self.mlp_norm = nn.RMSNorm(h)
            self.gate_up = nn.Linear(h, 2 * shape.ffn, bias=False)
            self.down = nn.Linear(shape.ffn, h, bias=False)

        def forward(self, x: Any) -> Any:
            b, t, _ = x.shape
            q, k, v = self.qkv(self.attn_norm(x)).split((q_dim, kv_dim, kv_dim), dim=-1)
            q = q.view(b, t, shape.heads, hd).transpose(1, 2)
            k = k.view(b, t, shape.kv_heads, hd).transpose(1, 2)
            v = v.view(b, t, shape.kv_heads, hd).transpose(1, 2)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=shape.kv_heads != shape.heads)
            x = x + self.out(a.transpose(1, 2).reshape(b, t, q_dim))
            gate, up = self.gate_up(self.mlp_norm(x)).chunk(2, dim=-1)
            return x + self.down(F.silu(gate) * up)

    class Transformer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(shape.vocab, h)
            self.blocks = nn.ModuleList(Block() for _ in range(shape.layers))
            self.norm = nn.RMSNorm(h)
            self.head = nn.Linear(h, shape.vocab, bias=False)
            if shape.tied_embeddings:
                self.head.weight = self.embed.weight

        def forward(self, ids: Any, targets: Any) -> Any:
            x = self.embed(ids)
            for block in self.blocks:
                x = block(x)
            logits = self.head(self.norm(x))
            return F.cross_entropy(logits.float().view(-1, shape.vocab), targets.view(-1))

    with torch.device(device):
        return Transformer()


def param_count(model: Any) -> int:
    return sum(p.numel() for p in model.parameters())


def shard(model: Any, precision: Precision, reshard_after_forward: bool = True, mesh: Any = None) -> Any:
    """fully_shard per block, then the root (embedding, final norm, head). Each unit prefetches
    the next one's AllGather in forward, as the composer assumes: on a GPU the CPU running ahead
    gives FSDP2 that for free, on a CPU nothing runs ahead and it must be asked for (backward
    prefetches one unit by default)."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    # A 2-D (replicate, shard) mesh makes it HSDP (verify/fsdp/hybrid.py); None: the world, 1-D.
    kwargs: dict[str, Any] = {} if mesh is None else {"mesh": mesh}
    if precision.param_dtype != "float32":
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=getattr(torch, precision.param_dtype),
                                                   reduce_dtype=getattr(torch, precision.reduce_dtype))
    for block in model.blocks:
        fully_shard(block, reshard_after_forward=reshard_after_forward, **kwargs)
    fully_shard(model, **kwargs)
    units = [model, *model.blocks]
    for unit, following in pairwise(units):
        unit.set_modules_to_forward_prefetch([following])
    return model


def batch(shape: ModelShape, tokens: int, device: Any, seed: int = 0) -> tuple[Any, Any]:
    import torch

    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, shape.vocab, (1, tokens + 1), generator=gen).to(device)
    return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()


def step(model: Any, optim: Any, ids: Any, targets: Any) -> None:
    """What a trainer times: forward, backward, optimizer step, zero_grad."""
    loss = model(ids, targets)
    loss.backward()
    optim.step()
    optim.zero_grad(set_to_none=True)


def optimizer(model: Any) -> Any:
    import torch

    return torch.optim.AdamW(model.parameters(), lr=1e-4)
