"""Shapes from a Hugging Face config.json, read from disk only (no hub access)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from ...core.errors import UsageError
from ...core.jsonfile import json_object, load_json
from .fields import _field, _name_from_path
from .shapes import ModelShape, VisionTower


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
    text = json_object(cfg.get("text_config"), cfg)
    model_type = str(text.get("model_type") or cfg.get("model_type") or "")
    if model_type in ("mpt", "gpt2"):   # a plain GELU MLP, LayerNorm, biases, learned positions
        from .gpt import from_config

        gpt = from_config(cfg, path)
        if gpt is not None:   # None when only text_config names the GPT layout: read it as any other
            return gpt
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
