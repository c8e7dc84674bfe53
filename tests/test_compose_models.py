"""Model shapes: parameter counts derived from the shapes against the published totals, and
Hugging Face config.json files giving the same counts as the presets."""

import json
from pathlib import Path

import pytest
from conftest import refused as _refused

from microbench.compose.model import PRESETS, from_hf_config, preset
from microbench.core.errors import UsageError

GPU = ["--gpu", "h100", "--nodes", "1", "--gpus-per-node", "2"]

DATA = Path(__file__).parent / "data" / "hf"

# Published totals (and active counts for mixtures of experts), with where they are stated:
PUBLISHED_TOTAL = {
    "llama-3.1-8b": 8.03e9,     # meta-llama/Llama-3.1-8B model card: "8.03B params"
    "llama-3.1-70b": 70.6e9,    # meta-llama/Llama-3.1-70B model card: "70.6B params"
    "mistral-7b": 7.24e9,       # mistralai/Mistral-7B-v0.1 on the hub: "7.24B params"
    "qwen2.5-14b": 14.7e9,      # Qwen/Qwen2.5-14B model card: "Number of Parameters: 14.7B"
    "gemma-3-12b": 12.2e9,      # google/gemma-3-12b-pt on the hub: "12.2B params" (vision encoder included)
    "gpt-oss-20b": 20.91e9,     # OpenAI gpt-oss model card, table 1: 20.91B total
    "gpt-oss-120b": 116.83e9,   # OpenAI gpt-oss model card, table 1: 116.83B total
    "mixtral-8x7b": 46.7e9,     # Mistral AI, "Mixtral of experts" (2024): 46.7B total
}
PUBLISHED_ACTIVE = {
    "gpt-oss-20b": 3.61e9,      # OpenAI gpt-oss model card: 3.61B active per token
    "gpt-oss-120b": 5.13e9,     # OpenAI gpt-oss model card: 5.13B active per token
}
MIXTRAL_ACTIVE_WITH_EMBEDDING = 12.9e9  # Mixtral paper: "12.9B active", embedding table counted


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_is_within_one_percent_of_its_published_total(name):
    assert name in PUBLISHED_TOTAL
    assert PRESETS[name].total_params == pytest.approx(PUBLISHED_TOTAL[name], rel=0.01)


@pytest.mark.parametrize("name", sorted(PUBLISHED_ACTIVE))
def test_mixture_of_experts_active_counts(name):
    assert PRESETS[name].active_params == pytest.approx(PUBLISHED_ACTIVE[name], rel=0.01)


def test_mixtral_active_count_under_mistrals_convention():
    m = PRESETS["mixtral-8x7b"]
    assert m.active_params + m.embedding_params == pytest.approx(MIXTRAL_ACTIVE_WITH_EMBEDDING, rel=0.01)
    assert m.active_params < m.total_params / 3


def test_dense_models_are_all_active_but_the_input_embedding():
    m = PRESETS["llama-3.1-8b"]
    assert m.total_params - m.active_params == m.embedding_params
    tied = PRESETS["gemma-3-12b"]
    assert tied.head_params == 0 and tied.tower_params > 0
    assert tied.active_params == tied.layers * tied.block_active_params + tied.vocab * tied.hidden + tied.hidden


@pytest.mark.parametrize("name", ["llama-3.1-8b", "gemma-3-12b", "gpt-oss-20b"])
def test_hf_config_gives_the_presets_counts(name):
    shape = from_hf_config(DATA / f"{name}.config.json")
    assert shape.total_params == PRESETS[name].total_params
    assert shape.active_params == PRESETS[name].active_params
    assert shape.layers == PRESETS[name].layers and shape.experts == PRESETS[name].experts
    assert (shape.sliding_window, shape.sliding_layers) == (PRESETS[name].sliding_window, PRESETS[name].sliding_layers)


def test_a_model_directory_is_read_through_its_config_json(tmp_path):
    (tmp_path / "config.json").write_text((DATA / "llama-3.1-8b.config.json").read_text())
    shape = from_hf_config(tmp_path)
    assert shape.total_params == PRESETS["llama-3.1-8b"].total_params and shape.name == tmp_path.name


def test_unknown_preset_lists_the_known_ones():
    with pytest.raises(UsageError, match="unknown --model 'llama-9b': expected one of llama-3.1-8b, .*mixtral-8x7b"):
        preset("llama-9b")


def test_bad_config_files(tmp_path):
    text = tmp_path / "config.json"
    text.write_text("{not json")
    with pytest.raises(UsageError, match="is not JSON"):
        from_hf_config(text)
    text.write_text("[1, 2]")
    with pytest.raises(UsageError, match="JSON list, not an object"):
        from_hf_config(text)
    cfg = json.loads((DATA / "llama-3.1-8b.config.json").read_text())
    del cfg["vocab_size"]
    text.write_text(json.dumps(cfg))
    with pytest.raises(UsageError, match="lacks the field 'vocab_size'"):
        from_hf_config(text)
    cfg["vocab_size"] = "big"
    text.write_text(json.dumps(cfg))
    with pytest.raises(UsageError, match="field 'vocab_size' is 'big'"):
        from_hf_config(text)
    with pytest.raises(UsageError, match="does not exist"):
        from_hf_config(tmp_path / "none.json")


HF = {"hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 4,
      "intermediate_size": 14336, "vocab_size": 32000}


@pytest.mark.parametrize("text,fragment", [
    (json.dumps(HF).replace("4096", "NaN"), "holds NaN at hidden_size: every number in it must be finite"),
    (json.dumps(HF).replace("4096", "Infinity"), "holds Infinity at hidden_size: every number in it must be finite"),
    (json.dumps({**HF, "num_key_value_heads": 3}),
     "num_key_value_heads 3 does not divide num_attention_heads 32; expected a divisor of it, e.g. 2"),
    (json.dumps({**HF, "num_key_value_heads": 64}), "num_key_value_heads 64 does not divide num_attention_heads 32"),
], ids=["hidden-nan", "hidden-inf", "kv-heads-3-of-32", "kv-heads-64-of-32"])
def test_compose_checks_the_numbers_of_a_model_config(cli, tmp_path, text, fragment):
    (tmp_path / "config.json").write_text(text)
    _refused(cli("compose", "--model-config", "config.json", "--net", "ib=40GB/s", *GPU, timeout=120), fragment)
    assert not (tmp_path / "results").exists()


def test_a_model_config_whose_heads_divide_is_accepted(tmp_path):
    from microbench.compose.model import from_hf_config

    (tmp_path / "config.json").write_text(json.dumps(HF))
    assert from_hf_config(tmp_path / "config.json").kv_heads == 8
