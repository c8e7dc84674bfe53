"""The models compose and verify know by name, with the shapes of their published config.json."""

from __future__ import annotations

from ...core.errors import UsageError
from .shapes import ModelShape, VisionTower

_GEMMA3_VISION = VisionTower(hidden=1152, layers=27, ffn=4304, patch=14, image=896, out_hidden=3840)

# Shapes from each model's config.json on the Hugging Face hub (meta-llama/Llama-3.1-8B,
# meta-llama/Llama-3.1-70B, mistralai/Mistral-7B-v0.1, Qwen/Qwen2.5-14B, google/gemma-3-12b-pt,
# openai/gpt-oss-20b, openai/gpt-oss-120b, mistralai/Mixtral-8x7B-v0.1).
PRESETS: dict[str, ModelShape] = {
    m.name: m
    for m in (
        ModelShape("llama-3.1-8b", hidden=4096, layers=32, heads=32, kv_heads=8, head_dim=128, ffn=14336, vocab=128256),
        ModelShape(
            "llama-3.1-70b", hidden=8192, layers=80, heads=64, kv_heads=8, head_dim=128, ffn=28672, vocab=128256
        ),
        ModelShape(
            "mistral-7b",
            hidden=4096,
            layers=32,
            heads=32,
            kv_heads=8,
            head_dim=128,
            ffn=14336,
            vocab=32000,
            sliding_window=4096,
            sliding_layers=32,
        ),
        ModelShape(
            "qwen2.5-14b",
            hidden=5120,
            layers=48,
            heads=40,
            kv_heads=8,
            head_dim=128,
            ffn=13824,
            vocab=152064,
            qkv_bias=True,
        ),
        ModelShape(
            "gemma-3-12b",
            hidden=3840,
            layers=48,
            heads=16,
            kv_heads=8,
            head_dim=256,
            ffn=15360,
            vocab=262208,
            tied_embeddings=True,
            norms_per_block=4,
            qk_norm=True,
            towers=(_GEMMA3_VISION,),
            sliding_window=1024,
            sliding_layers=40,
        ),  # five local layers to one global
        ModelShape(
            "gpt-oss-20b",
            hidden=2880,
            layers=24,
            heads=64,
            kv_heads=8,
            head_dim=64,
            ffn=2880,
            vocab=201088,
            experts=32,
            top_k=4,
            qkv_bias=True,
            mlp_bias=True,
            attention_sinks=True,
            sliding_window=128,
            sliding_layers=12,
        ),  # alternating banded and full layers
        ModelShape(
            "gpt-oss-120b",
            hidden=2880,
            layers=36,
            heads=64,
            kv_heads=8,
            head_dim=64,
            ffn=2880,
            vocab=201088,
            experts=128,
            top_k=4,
            qkv_bias=True,
            mlp_bias=True,
            attention_sinks=True,
            sliding_window=128,
            sliding_layers=18,
        ),
        ModelShape(
            "mixtral-8x7b",
            hidden=4096,
            layers=32,
            heads=32,
            kv_heads=8,
            head_dim=128,
            ffn=14336,
            vocab=32000,
            experts=8,
            top_k=2,
        ),
    )
}


def preset(name: str) -> ModelShape:
    key = name.strip().lower()
    if key not in PRESETS:
        raise UsageError(
            f"unknown --model {name!r}: expected one of {', '.join(PRESETS)} "
            f"(or --model-config config.json, or --params/--layers)"
        )
    return PRESETS[key]
