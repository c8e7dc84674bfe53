"""The GPT / MPT layout: one fused QKV projection, LayerNorm (weight and bias), a plain GELU MLP
(up d -> expansion x d, down), biases on every linear, learned position embeddings, the head
tied to the token embedding. MosaicML's MPT (llm-foundry) and OpenAI's GPT-2 are built so; many
published training runs use them.

Counts are derived from the shapes as for `shapes.ModelShape` (whose interface this keeps, so
every composer path takes either): MPT-7B at 2048 positions is 12 d^2 L (weights) + 9 d L
(linear biases) + 4 d L (two LayerNorms) + 2 d (final LayerNorm) + V d + S d = 6,658,859,008,
llm-foundry's published NumParams (tests/test_compose_gpt_layout.py holds every published row).
MPT's `no_bias` drops every bias, the norms' included; ALiBi or RoPE replace learned positions.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...core.errors import UsageError
from ...core.jsonfile import json_object
from .fields import _field, _name_from_path
from .shapes import ModelShape


@dataclass(frozen=True)
class GptShape(ModelShape):
    gelu_mlp: bool = True        # a plain two-matrix MLP (up, GELU, down), not gated
    linear_bias: bool = True     # a bias on every linear (qkv, out, up, down)
    norm_bias: bool = True       # LayerNorm with a bias (RMS norms have none)
    positions: int = 0           # learned position embeddings (0: ALiBi, RoPE or none)

    @property
    def _norm_params(self) -> int:
        return self.hidden * (2 if self.norm_bias else 1)

    @property
    def attention_params(self) -> int:
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        n = self.hidden * (q + 2 * kv) + q * self.hidden
        return n + (q + 2 * kv + self.hidden if self.linear_bias else 0)

    @property
    def expert_params(self) -> int:
        return 2 * self.hidden * self.ffn + (self.ffn + self.hidden if self.linear_bias else 0)

    @property
    def block_params(self) -> int:
        return self.attention_params + self.expert_params + self.norms_per_block * self._norm_params

    @property
    def block_active_params(self) -> int:
        return self.block_params

    @property
    def root_params(self) -> int:
        return self.embedding_params + self.head_params + self._norm_params + self.positions * self.hidden

    @property
    def active_params(self) -> int:
        return self.layers * self.block_active_params + self.vocab * self.hidden + self._norm_params


def mpt(name: str, d_model: int, n_heads: int, n_layers: int, vocab: int, *, expansion_ratio: float = 4,
        max_seq_len: int = 2048, no_bias: bool = False, learned_pos_emb: bool = True, kv_heads: int | None = None,
        source: str = "MPT layout") -> GptShape:
    ffn = int(expansion_ratio * d_model)
    return GptShape(name=name, hidden=d_model, layers=n_layers, heads=n_heads, kv_heads=kv_heads or n_heads,
                    head_dim=d_model // n_heads, ffn=ffn, vocab=vocab, tied_embeddings=True,
                    linear_bias=not no_bias, norm_bias=not no_bias,
                    positions=max_seq_len if learned_pos_emb else 0, source=source)


def _flag(cfg: dict[str, Any], path: str, key: str, default: bool) -> bool:
    value = cfg.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise UsageError(f"config {path!r}: field {key!r} is {value!r}; expected true or false")
    return value


def from_mpt_config(cfg: dict[str, Any], path: str) -> GptShape:
    """llm-foundry's MPTConfig (model_type "mpt"): d_model, n_heads, n_layers, expansion_ratio
    (or ffn_config.ffn_hidden_size), max_seq_len, vocab_size, no_bias, learned_pos_emb,
    attn_config.{alibi, rope, kv_n_heads}."""
    attn = json_object(cfg.get("attn_config"))
    d = _field(cfg, path, ("d_model",))
    heads = _field(cfg, path, ("n_heads",))
    ffn_cfg = json_object(cfg.get("ffn_config"))
    hidden_ffn = ffn_cfg.get("ffn_hidden_size")
    ratio = cfg.get("expansion_ratio", 4)
    if hidden_ffn is not None:
        ratio = _field(ffn_cfg, path, ("ffn_hidden_size",)) / d
    elif isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not ratio > 0 or ratio != ratio:
        raise UsageError(f"config {path!r}: field 'expansion_ratio' is {ratio!r}; expected a positive number, e.g. 4")
    positions = _flag(cfg, path, "learned_pos_emb", True) and not (attn.get("alibi") or attn.get("rope"))
    kv = _field(attn, path, ("kv_n_heads",), default=heads) if attn.get("attn_type") == "grouped_query_attention" \
        else heads
    return mpt(str(cfg.get("_name_or_path") or _name_from_path(Path(path))), d, heads,
               _field(cfg, path, ("n_layers",)), _field(cfg, path, ("vocab_size",)), expansion_ratio=ratio,
               max_seq_len=_field(cfg, path, ("max_seq_len",), default=2048),
               no_bias=_flag(cfg, path, "no_bias", False), learned_pos_emb=positions, kv_heads=kv, source=path)


def from_gpt2_config(cfg: dict[str, Any], path: str) -> GptShape:
    """Hugging Face's GPT2Config (model_type "gpt2"): n_embd, n_head, n_layer, n_inner (4 x
    n_embd when null), n_positions, vocab_size; biases and LayerNorm biases always."""
    d = _field(cfg, path, ("n_embd",))
    heads = _field(cfg, path, ("n_head",))
    return GptShape(name=str(cfg.get("_name_or_path") or _name_from_path(Path(path))), hidden=d,
                    layers=_field(cfg, path, ("n_layer",)), heads=heads, kv_heads=heads, head_dim=d // heads,
                    ffn=_field(cfg, path, ("n_inner",), default=4 * d), vocab=_field(cfg, path, ("vocab_size",)),
                    tied_embeddings=_flag(cfg, path, "tie_word_embeddings", True),
                    positions=_field(cfg, path, ("n_positions", "n_ctx"), default=1024), source=path)


def from_config(cfg: dict[str, Any], path: str) -> GptShape | None:
    """The GPT-layout shape of an MPT or GPT-2 config.json, or None for any other model type."""
    model_type = str(cfg.get("model_type") or "")
    if model_type == "mpt":
        return from_mpt_config(cfg, path)
    if model_type == "gpt2":
        return from_gpt2_config(cfg, path)
    return None
