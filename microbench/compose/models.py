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
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from ..core.errors import UsageError
from ..core.jsonfile import finite_number, load_json


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
        projector = h * self.out_hidden + h   # projection + its input norm
        return patch_embed + positions + self.layers * block + post_norm + projector


@dataclass(frozen=True)
class ModelShape:
    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int                     # per expert for a mixture of experts
    vocab: int
    tied_embeddings: bool = False
    experts: int = 1
    top_k: int = 1
    qkv_bias: bool = False
    mlp_bias: bool = False       # biases on expert/MLP projections (gpt-oss)
    norms_per_block: int = 2     # gemma-3 has four (pre/post around attention and MLP)
    qk_norm: bool = False        # per-head RMS norm on queries and keys (gemma-3)
    attention_sinks: bool = False  # one learned logit per head (gpt-oss)
    towers: tuple[VisionTower, ...] = ()
    sliding_window: int = 0      # keys a query sees on sliding-window layers (0: none)
    sliding_layers: int = 0      # how many of the layers use the window
    source: str = "preset"

    # ---- per block
    @property
    def attention_params(self) -> int:
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        n = self.hidden * (q + 2 * kv) + q * self.hidden
        if self.qkv_bias:
            n += q + 2 * kv
        if self.mlp_bias:   # gpt-oss biases every attention projection, the output one included
            n += self.hidden
        if self.qk_norm:
            n += 2 * self.head_dim
        if self.attention_sinks:
            n += self.heads
        return n

    @property
    def expert_params(self) -> int:
        n = 3 * self.hidden * self.ffn   # gate, up, down
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
        return (self.attention_params + self.router_params + self.experts * self.expert_params
                + self.norms_per_block * self.hidden)

    @property
    def block_active_params(self) -> int:
        return (self.attention_params + self.router_params + self.top_k * self.expert_params
                + self.norms_per_block * self.hidden)

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
        out.update(total_params=self.total_params, active_params=self.active_params,
                   block_params=self.block_params, root_params=self.root_params)
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


_GEMMA3_VISION = VisionTower(hidden=1152, layers=27, ffn=4304, patch=14, image=896, out_hidden=3840)

# Shapes from each model's config.json on the Hugging Face hub (meta-llama/Llama-3.1-8B,
# meta-llama/Llama-3.1-70B, mistralai/Mistral-7B-v0.1, Qwen/Qwen2.5-14B, google/gemma-3-12b-pt,
# openai/gpt-oss-20b, openai/gpt-oss-120b, mistralai/Mixtral-8x7B-v0.1).
PRESETS: dict[str, ModelShape] = {m.name: m for m in (
    ModelShape("llama-3.1-8b", hidden=4096, layers=32, heads=32, kv_heads=8, head_dim=128, ffn=14336, vocab=128256),
    ModelShape("llama-3.1-70b", hidden=8192, layers=80, heads=64, kv_heads=8, head_dim=128, ffn=28672, vocab=128256),
    ModelShape("mistral-7b", hidden=4096, layers=32, heads=32, kv_heads=8, head_dim=128, ffn=14336, vocab=32000,
               sliding_window=4096, sliding_layers=32),
    ModelShape("qwen2.5-14b", hidden=5120, layers=48, heads=40, kv_heads=8, head_dim=128, ffn=13824, vocab=152064,
               qkv_bias=True),
    ModelShape("gemma-3-12b", hidden=3840, layers=48, heads=16, kv_heads=8, head_dim=256, ffn=15360, vocab=262208,
               tied_embeddings=True, norms_per_block=4, qk_norm=True, towers=(_GEMMA3_VISION,),
               sliding_window=1024, sliding_layers=40),   # five local layers to one global
    ModelShape("gpt-oss-20b", hidden=2880, layers=24, heads=64, kv_heads=8, head_dim=64, ffn=2880, vocab=201088,
               experts=32, top_k=4, qkv_bias=True, mlp_bias=True, attention_sinks=True,
               sliding_window=128, sliding_layers=12),    # alternating banded and full layers
    ModelShape("gpt-oss-120b", hidden=2880, layers=36, heads=64, kv_heads=8, head_dim=64, ffn=2880, vocab=201088,
               experts=128, top_k=4, qkv_bias=True, mlp_bias=True, attention_sinks=True,
               sliding_window=128, sliding_layers=18),
    ModelShape("mixtral-8x7b", hidden=4096, layers=32, heads=32, kv_heads=8, head_dim=128, ffn=14336, vocab=32000,
               experts=8, top_k=2),
)}


def preset(name: str) -> ModelShape:
    key = name.strip().lower()
    if key not in PRESETS:
        raise UsageError(f"unknown --model {name!r}: expected one of {', '.join(PRESETS)} "
                         f"(or --model-config config.json, or --params/--layers)")
    return PRESETS[key]


# --------------------------------------------------------------------------- Hugging Face config.json

def _field(cfg: dict[str, Any], path: str, names: tuple[str, ...], default: Any = None) -> Any:
    for name in names:
        if name in cfg and cfg[name] is not None:
            value = cfg[name]
            if not finite_number(value) or value <= 0 or value != int(value):
                raise UsageError(f"config {path!r}: field {name!r} is {value!r}; expected a positive whole number")
            return int(value)
    if default is not None:
        return default
    raise UsageError(f"config {path!r} lacks the field {names[0]!r} (a Hugging Face config.json names it, "
                     f"e.g. \"{names[0]}\": 4096)")


def _sliding(text: dict[str, Any], path: str, layers: int) -> tuple[int, int]:
    """(window, layers using it) from layer_types, or sliding_window with its pattern."""
    window = text.get("sliding_window")
    if not window or text.get("use_sliding_window") is False:
        return 0, 0
    window = _field(text, path, ("sliding_window",))
    types = text.get("layer_types")
    if isinstance(types, list) and types:
        return window, sum(1 for t in types if "sliding" in str(t))
    # Gemma 3's config class defaults to five local layers per global one; its config.json may omit it.
    pattern = text.get("sliding_window_pattern", 6 if str(text.get("model_type", "")).startswith("gemma3") else None)
    if isinstance(pattern, int) and not isinstance(pattern, bool) and pattern > 0:
        return window, layers - layers // pattern   # every pattern-th layer is global
    return window, layers


def _name_from_path(path: Path) -> str:
    if path.name == "config.json":
        return path.parent.name or "config"
    return path.name.removesuffix(".json").removesuffix(".config")


def from_hf_config(path: str | Path) -> ModelShape:
    """Shapes from a Hugging Face config.json, read from disk only (no hub access). Multimodal
    configs keep the language model under `text_config` and an encoder under `vision_config`."""
    if Path(path).is_dir() and (Path(path) / "config.json").is_file():
        path = Path(path) / "config.json"   # a downloaded model directory
    path = str(path)
    # finite: a NaN hidden_size is refused as --params nan is, not met as "cannot convert float NaN".
    cfg = load_json(path, what="--model-config", finite=True,
                    expected="a Hugging Face config.json (or the model directory holding it)")
    if not isinstance(cfg, dict):
        raise UsageError(f"--model-config {path!r} holds a JSON {type(cfg).__name__}, not an object; "
                         f"expected a Hugging Face config.json")
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    model_type = str(text.get("model_type") or cfg.get("model_type") or "")
    hidden = _field(text, path, ("hidden_size", "d_model", "n_embd"))
    heads = _field(text, path, ("num_attention_heads", "n_head"))
    kv_heads = _field(text, path, ("num_key_value_heads",), default=heads)
    if heads % kv_heads:
        # Grouped-query attention shares each KV head among heads / kv_heads query heads: a
        # model with 32 heads and 3 KV heads cannot be built, so no step time is predicted for it.
        good = max(d for d in range(1, kv_heads + 1) if heads % d == 0)
        raise UsageError(f"--model-config {path!r}: num_key_value_heads {kv_heads} does not divide "
                         f"num_attention_heads {heads}; expected a divisor of it, e.g. {good}")
    experts = _field(text, path, ("num_local_experts", "num_experts", "n_routed_experts"), default=1)
    shape = ModelShape(
        name=str(cfg.get("_name_or_path") or _name_from_path(Path(path))),
        hidden=hidden,
        layers=_field(text, path, ("num_hidden_layers", "n_layer")),
        heads=heads,
        kv_heads=kv_heads,
        head_dim=_field(text, path, ("head_dim",), default=max(1, hidden // heads)),
        ffn=_field(text, path, ("moe_intermediate_size", "intermediate_size", "n_inner")),
        vocab=_field(text, path, ("vocab_size",)),
        # Gemma's config classes default to tied embeddings and its config.json leaves it out.
        tied_embeddings=bool(cfg.get("tie_word_embeddings", text.get("tie_word_embeddings",
                                                                     model_type.startswith("gemma")))),
        experts=experts,
        top_k=_field(text, path, ("num_experts_per_tok", "experts_per_token", "num_experts_per_token"),
                     default=1) if experts > 1 else 1,
        qkv_bias=bool(text.get("attention_bias") or text.get("qkv_bias") or model_type.startswith("qwen2")),
        mlp_bias=bool(text.get("mlp_bias") or model_type == "gpt_oss"),
        norms_per_block=4 if model_type.startswith("gemma3") or model_type.startswith("gemma2") else 2,
        qk_norm=model_type.startswith("gemma3") or model_type.startswith("qwen3"),
        attention_sinks=model_type == "gpt_oss",
        source=path,
    )
    window, sliding = _sliding(text, path, shape.layers)
    shape = replace(shape, sliding_window=window, sliding_layers=sliding)
    vision = cfg.get("vision_config")
    if isinstance(vision, dict) and text is not cfg:
        shape = replace(shape, towers=(VisionTower(
            hidden=_field(vision, path, ("hidden_size",)), layers=_field(vision, path, ("num_hidden_layers",)),
            ffn=_field(vision, path, ("intermediate_size",)), patch=_field(vision, path, ("patch_size",)),
            image=_field(vision, path, ("image_size",)), out_hidden=hidden),))
    return shape


def format_params(n: float) -> str:
    if not math.isfinite(n):
        return str(n)
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.1f} M"


__all__ = ["ModelShape", "CrudeModel", "VisionTower", "PRESETS", "preset", "from_hf_config", "format_params"]
