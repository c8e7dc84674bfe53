"""The GPT / MPT layout (microbench/compose/model/gpt.py): parameter counts held to the published
figures, and the MPT and GPT-2 config.json readers."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest

from microbench.compose.model import gpt as gpt_layout
from microbench.core.errors import UsageError

PUBLISHED = Path(__file__).resolve().parents[1] / "benchmarks" / "published" / "published_fsdp_dev.csv"


def _rows():
    with open(PUBLISHED, newline="") as fh:
        return list(csv.DictReader(fh))


@pytest.mark.parametrize("row", _rows(), ids=lambda r: f"{r['model']}-{r['seq_len']}")
def test_mpt_counts_are_llm_foundrys_published_numparams(row):
    # NumParams from llm-foundry's benchmark tables (scripts/train/benchmarking/README.md @8c8dd48),
    # which include the learned position table (max_seq_len x d_model)
    published = int(re.search(r"NumParams=(\d+)", row["notes"]).group(1))
    shape = gpt_layout.mpt(row["model"], int(row["d_model"]), int(row["n_heads"]), int(row["layers"]),
                           int(row["vocab"]), max_seq_len=int(row["seq_len"]))
    assert shape.total_params == published


def test_gpt2_small_from_its_config_is_124m():
    # openai-community/gpt2: 124,439,808 parameters (the Hugging Face model's num_parameters())
    cfg = {"model_type": "gpt2", "n_embd": 768, "n_head": 12, "n_layer": 12, "n_positions": 1024,
           "vocab_size": 50257, "n_inner": None}
    shape = gpt_layout.from_config(cfg, "gpt2/config.json")
    assert shape.total_params == 124_439_808
    assert shape.ffn == 3072 and shape.tied_embeddings


def test_mpt_config_reads_no_bias_alibi_and_expansion():
    d, L, V = 2048, 24, 50368
    cfg = {"model_type": "mpt", "d_model": d, "n_heads": 16, "n_layers": L, "expansion_ratio": 4,
           "max_seq_len": 2048, "vocab_size": V, "no_bias": True, "attn_config": {"alibi": True}}
    shape = gpt_layout.from_config(cfg, "mpt/config.json")
    assert shape.positions == 0 and not shape.linear_bias
    assert shape.total_params == 12 * d * d * L + 2 * d * L + d + V * d
    with_pos = gpt_layout.from_config({**cfg, "no_bias": False, "attn_config": {}}, "mpt/config.json")
    assert with_pos.total_params == shape.total_params + 9 * d * L + 2 * d * L + d + 2048 * d


def test_other_model_types_are_not_this_layout():
    assert gpt_layout.from_config({"model_type": "llama"}, "x.json") is None


@pytest.mark.parametrize("field, value", [("expansion_ratio", "four"), ("expansion_ratio", -1), ("no_bias", "yes"),
                                          ("d_model", 0)])
def test_a_bad_mpt_field_is_refused_naming_it(field, value):
    cfg = {"model_type": "mpt", "d_model": 2048, "n_heads": 16, "n_layers": 24, "vocab_size": 50368, field: value}
    with pytest.raises(UsageError, match=field):
        gpt_layout.from_config(cfg, "mpt/config.json")


def test_model_config_reads_an_mpt_config_json(tmp_path):
    import json

    from microbench.compose.model import from_hf_config

    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "mpt", "d_model": 4096, "n_heads": 32, "n_layers": 32,
                                "expansion_ratio": 4, "max_seq_len": 2048, "vocab_size": 50368, "no_bias": False,
                                "attn_config": {"alibi": False}}))
    shape = from_hf_config(tmp_path)
    assert shape.total_params == 6_658_859_008 and shape.gelu_mlp   # llm-foundry's MPT-7B NumParams
