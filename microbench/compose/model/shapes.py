"""Model descriptions with real shapes, and the parameter counts derived from them.

A decoder-only transformer: an embedding table, `layers` identical blocks (attention with
grouped-query heads, a gated MLP or a mixture of gated experts, RMS norms) and a final norm with
an output head (tied to the embedding or not), plus optional extra towers such as a vision
encoder. Counts are derived from the shapes, never typed in, so a preset and the Hugging Face
config.json of the same model give the same number (tests hold both to the published totals).

"Active" parameters are the ones a token's FLOPs touch: every block weight except the experts a
token is not routed to, plus the output head; the input embedding is a lookup, not a matmul, so
it is excluded (the convention of OpenAI's gpt-oss model card; Mistral's "12.9B active" for
Mixtral counts the embedding table too, see the tests).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class VisionTower:
    """A ViT encoder (SigLIP style: patch conv, learned positions, pre-norm blocks with biased
    linear layers and LayerNorm) and the linear projector into the language model's width."""

    hidden: int
    layers: int
    ffn: int
    patch: int
    image: int
    out_hidden: int
    channels: int = 3

    @property
    def params(self) -> int:
        h = self.hidden
        patch_embed = self.channels * self.patch * self.patch * h + h
        positions = (self.image // self.patch) ** 2 * h
        block = 4 * (h * h + h) + (h * self.ffn + self.ffn) + (self.ffn * h + h) + 2 * 2 * h
        post_norm = 2 * h
        projector = h * self.out_hidden + h  # projection + its input norm
        return patch_embed + positions + self.layers * block + post_norm + projector


@dataclass(frozen=True)
class ModelShape:
    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int  # per expert for a mixture of experts
    vocab: int
    tied_embeddings: bool = False
    experts: int = 1
    top_k: int = 1
    qkv_bias: bool = False
    mlp_bias: bool = False  # biases on expert/MLP projections (gpt-oss)
    norms_per_block: int = 2  # gemma-3 has four (pre/post around attention and MLP)
    qk_norm: bool = False  # per-head RMS norm on queries and keys (gemma-3)
    attention_sinks: bool = False  # one learned logit per head (gpt-oss)
    towers: tuple[VisionTower, ...] = ()
    sliding_window: int = 0  # keys a query sees on sliding-window layers (0: none)
    sliding_layers: int = 0  # how many of the layers use the window
    source: str = "preset"

    # ---- per block
    @property
    def attention_params(self) -> int:
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        n = self.hidden * (q + 2 * kv) + q * self.hidden
        if self.qkv_bias:
            n += q + 2 * kv
        if self.mlp_bias:  # gpt-oss biases every attention projection, the output one included
            n += self.hidden
        if self.qk_norm:
            n += 2 * self.head_dim
        if self.attention_sinks:
            n += self.heads
        return n

    @property
    def expert_params(self) -> int:
        n = 3 * self.hidden * self.ffn  # gate, up, down
        if self.mlp_bias:
            n += 2 * self.ffn + self.hidden
        return n

    @property
    def router_params(self) -> int:
        if self.experts <= 1:
            return 0
        return self.hidden * self.experts + (self.experts if self.mlp_bias else 0)

    @property
    def block_params(self) -> int:
        return (
            self.attention_params
            + self.router_params
            + self.experts * self.expert_params
            + self.norms_per_block * self.hidden
        )

    @property
    def block_active_params(self) -> int:
        return (
            self.attention_params
            + self.router_params
            + self.top_k * self.expert_params
            + self.norms_per_block * self.hidden
        )

    # ---- the root unit: embeddings, final norm, head, towers
    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def head_params(self) -> int:
        return 0 if self.tied_embeddings else self.vocab * self.hidden

    @property
    def tower_params(self) -> int:
        return sum(t.params for t in self.towers)

    @property
    def root_params(self) -> int:
        return self.embedding_params + self.head_params + self.hidden + self.tower_params

    @property
    def total_params(self) -> int:
        return self.root_params + self.layers * self.block_params

    @property
    def active_params(self) -> int:
        # The head's matmul runs for every token even when its weight is the tied embedding.
        return self.layers * self.block_active_params + self.vocab * self.hidden + self.hidden

    def describe(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(
            total_params=self.total_params,
            active_params=self.active_params,
            block_params=self.block_params,
            root_params=self.root_params,
        )
        return out


@dataclass(frozen=True)
class CrudeModel:
    """--params/--layers: the escape hatch when no shapes are known. Every parameter sits in
    `layers` equal blocks, all active; no attention FLOPs, no root unit, no activation estimate."""

    name: str
    params: float
    layers: int
    source: str = "--params/--layers"

    total_params = property(lambda self: self.params)
    active_params = property(lambda self: self.params)
    block_params = property(lambda self: self.params / self.layers)
    block_active_params = property(lambda self: self.params / self.layers)
    root_params = property(lambda self: 0)
    experts = 1

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "total_params": self.params, "layers": self.layers, "source": self.source}


def format_params(n: float) -> str:
    if not math.isfinite(n):
        return str(n)
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.1f} M"


__all__ = ["ModelShape", "CrudeModel", "VisionTower", "format_params"]
