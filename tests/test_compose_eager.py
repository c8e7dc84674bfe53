"""Memory-bound work as eager PyTorch runs it (compose/kernels/eager.py over data/eager_ops.json,
which benchmarks/eager_ops.py counts): the counted matmuls agree with blocks.py's list and
recompute.py's modes, the counted bytes are what the composer prices, a layout the count does not
cover keeps the hand list, and a damaged file is refused naming the entry. The count itself, rerun
and compared at a real hidden size, is in test_eager_ops.py (needs torch)."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from microbench.compose import fsdp, kernels
from microbench.compose.kernels import blocks, eager, recompute
from microbench.compose.model import PRESETS
from microbench.compose.model.gpt import mpt
from microbench.core.errors import UsageError

LLAMA = PRESETS["llama-3.1-8b"]
QWEN = PRESETS["qwen2.5-14b"]
MPT760 = mpt("MPT-760m", 1536, 12, 24, 50368, max_seq_len=2048)
MPT7_NOBIAS = mpt("MPT-7b", 4096, 32, 32, 50368, no_bias=True, learned_pos_emb=False)
CALLS = ("sdpa", "llmfoundry-triton", "llmfoundry-flash")


def _shapes(ks):
    return Counter((k.m, k.n, k.k) for k in ks if k.cls == "matmul")


@pytest.mark.parametrize("model, precision, call", [
    (MPT760, "amp_bf16", "llmfoundry-triton"), (MPT760, "bf16", "llmfoundry-flash"), (MPT760, "bf16", "sdpa"),
    (MPT7_NOBIAS, "bf16", "sdpa"), (LLAMA, "bf16", "sdpa"), (QWEN, "bf16", "sdpa")])
def test_the_counted_matmuls_are_blocks_lists_forward_backward_and_recompute(model, precision, call):
    counted = eager.counted_block(model, 2, 2048, precision, call)
    assert counted is not None
    fwd = blocks.block_forward(model, 2, 2048)
    assert Counter(counted.matmuls("fwd")) == _shapes(fwd)
    assert Counter(counted.matmuls("bwd")) == _shapes(b for k in fwd for b in blocks.backward_of(k))
    # recompute.py's modes are what torch <= 2.0 re-ran (no early stop)
    for mode in ("full", "ops"):
        again = recompute.recomputed(fwd, recompute.parse_checkpointing(mode))
        assert Counter(counted.matmuls(f"recompute_{mode}_no_early_stop")) == _shapes(again)


def test_early_stop_skips_what_backward_does_not_need():
    counted = eager.counted_block(MPT760, 2, 2048, "amp_bf16", "llmfoundry-triton")
    full, early = counted.matmuls("recompute_full_no_early_stop"), counted.matmuls("recompute_full")
    # the MLP's down projection: its output is no tensor backward saved
    assert Counter(full) - Counter(early) == Counter({(4096, 1536, 6144): 1})


def test_counted_bytes_scale_with_tokens_and_name_each_op():
    one, two = (eager.counted_block(MPT760, b, 2048, "amp_bf16", "llmfoundry-triton") for b in (1, 2))
    for pass_ in ("fwd", "bwd"):
        by_op = {k.name: k.bytes for k in one.memory(pass_)}
        # per-token terms double, the few parameter-sized ones (bias and norm gradients) do not
        for k in two.memory(pass_):
            assert k.bytes == pytest.approx(2 * by_op[k.name], rel=0.01)
    names = {k.name for k in one.memory("bwd")}
    assert {"native_layer_norm_backward", "gelu_backward", "cat", "add.Tensor", "sum.dim_IntList"} <= names


def test_the_gpt_block_moves_114_bytes_per_token_and_hidden_unit():
    # LayerNorm (2 x 4 h), residual adds (2 x 6 h), GELU on 4 h (16 h) forward; backward adds the
    # split's gradients concatenated (12 h), the residual branches' gradient sums and bias sums
    c = eager.counted_block(MPT760, 1, 2048, "amp_bf16", "llmfoundry-triton")
    h, t = 1536, 2048
    per = {p: sum(k.bytes for k in c.memory(p)) / (t * h) for p in ("fwd", "bwd")}
    assert per["fwd"] == pytest.approx(36, abs=0.1)
    assert per["bwd"] == pytest.approx(78, abs=0.2)


def test_flash_attn_padding_moves_bytes_of_its_own():
    triton = eager.counted_block(MPT760, 2, 2048, "bf16", "llmfoundry-triton")
    flash = eager.counted_block(MPT760, 2, 2048, "bf16", "llmfoundry-flash")
    extra = {p: sum(k.bytes for k in flash.memory(p)) - sum(k.bytes for k in triton.memory(p)) for p in ("fwd", "bwd")}
    t, h = 4096, 1536
    assert extra["fwd"] == pytest.approx(18 * t * h, rel=0.05)   # three gathers, zeros, index_put
    assert extra["bwd"] == pytest.approx(22 * t * h, rel=0.05)   # a gather, three zeros + scatters
    assert {"gather", "index_put_"} <= {k.name for k in flash.memory("fwd")}


def test_autocast_over_bf16_parameters_runs_the_same_ops_as_bf16():
    data = json.loads(eager.DATA.read_text())
    assert data["blocks"]["gpt/amp_bf16/llmfoundry-triton/bias/mha"] == {"same_as": "gpt/bf16/llmfoundry-triton/bias/mha"}
    a = eager.counted_block(MPT760, 2, 2048, "amp_bf16", "llmfoundry-triton")
    b = eager.counted_block(MPT760, 2, 2048, "bf16", "llmfoundry-triton")
    assert a.passes == b.passes


@pytest.mark.parametrize("name", ["gpt-oss-20b", "mixtral-8x7b", "gemma-3-12b"])
def test_a_layout_the_count_does_not_cover_keeps_the_hand_list(name):
    model = PRESETS[name]
    assert eager.counted_block(model, 1, 2048, "bf16", "sdpa") is None
    compute = kernels.priced_compute(model, fsdp.TrainSpec(ranks=8, micro_batch=1, seq_len=2048, flops_per_rank=1e15),
                                     kernels.TableRates(kernels.shipped("h100"), 3350.0))
    assert compute.memory_from[0] == "blocks: hand-listed"


def test_the_step_prices_the_counted_bytes_and_says_so():
    train = fsdp.TrainSpec(ranks=8, micro_batch=2, seq_len=2048, flops_per_rank=1e15, precision="amp_bf16",
                           attention_call="llmfoundry-triton", loss_kernel="fused", activation_checkpointing="full")
    rates = kernels.TableRates(kernels.shipped("h100"), 3350.0)
    counted = kernels.priced_compute(MPT760, train, rates)
    hand = kernels.priced_compute(MPT760, fsdp.TrainSpec(**{**train.__dict__, "counted_ops": False}), rates)
    assert counted.memory_from == ("blocks: counted gpt/amp_bf16/llmfoundry-triton/bias/mha",
                                   "root: counted gpt/amp_bf16/bias/positions/fused")
    assert hand.memory_from == ("blocks: hand-listed", "root: hand-listed")
    mem = {c.memory_from[0]: sum(r.bytes for r in c.rows if r.cls == "memory") for c in (counted, hand)}
    assert mem[counted.memory_from[0]] > mem[hand.memory_from[0]]
    # early stop recomputes less than the whole forward
    late = kernels.priced_compute(MPT760, fsdp.TrainSpec(**{**train.__dict__, "recompute_early_stop": False}), rates)
    flops = [sum(r.flops for r in c.rows if r.pass_ == "recompute") for c in (counted, late)]
    assert flops[0] < flops[1]


def _damaged(tmp_path, monkeypatch, edit):
    data = json.loads(eager.DATA.read_text())
    edit(data)
    path = tmp_path / "eager_ops.json"
    path.write_text(json.dumps(data))
    monkeypatch.setattr(eager, "DATA", path)
    eager._data.cache_clear()
    eager._counted.cache_clear()


@pytest.mark.parametrize("edit, where", [
    (lambda d: d["blocks"]["gpt/bf16/llmfoundry-triton/bias/mha"]["fwd"][0]["bytes"].update({"D*H": 1.5}),
     "blocks.gpt/bf16/llmfoundry-triton/bias/mha.fwd[0].bytes.D*H"),
    (lambda d: d["blocks"]["gpt/bf16/llmfoundry-triton/bias/mha"]["bwd"][0].pop("m"),
     "blocks.gpt/bf16/llmfoundry-triton/bias/mha.bwd[0].m"),
    (lambda d: d["blocks"].pop("gpt/bf16/llmfoundry-triton/bias/mha"), "blocks.gpt/bf16/llmfoundry-triton/bias/mha")])
def test_a_damaged_count_is_refused_naming_the_entry(tmp_path, monkeypatch, edit, where):
    _damaged(tmp_path, monkeypatch, edit)
    try:
        with pytest.raises(UsageError, match="eager op counts") as err:
            eager.counted_block(MPT760, 1, 2048, "bf16", "llmfoundry-triton")
        assert where in str(err.value) and "benchmarks/eager_ops.py" in str(err.value)
    finally:
        eager._data.cache_clear()
        eager._counted.cache_clear()
