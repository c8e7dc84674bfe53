"""Compute priced per kernel (microbench/compose/kernels): the kernel list, FLOP counts, the
checkpointing modes, the tables' loader and lookups, the calibration from one measured step."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from microbench.compose import fsdp, kernels
from microbench.compose.curves import synthetic_network
from microbench.compose.model.gpt import mpt
from microbench.compose.kernels import blocks, tables
from microbench.compose.model import PRESETS
from microbench.core.errors import UsageError

LLAMA = PRESETS["llama-3.1-8b"]
MPT7 = mpt("MPT-7b", 4096, 32, 32, 50368, max_seq_len=2048)


def test_llama_block_forward_is_its_kernels_in_run_order():
    names = [k.name for k in blocks.block_forward(LLAMA, 1, 2048)]
    assert names == ["norm", "q", "k", "v", "rotary", "attention", "attn_out", "residual", "norm",
                     "mlp_gate", "mlp_up", "swiglu", "mlp_down", "residual"]
    q = next(k for k in blocks.block_forward(LLAMA, 2, 4096) if k.name == "k")
    assert (q.m, q.n, q.k, q.op) == (8192, 1024, 4096, "mm")


def test_matmul_flops_are_two_per_weight_per_token_and_attention_is_causal():
    t, s = 2048, 2048
    fwd = blocks.block_forward(LLAMA, 1, s)
    mm = sum(k.total_flops for k in fwd if k.cls == "matmul")
    weights = LLAMA.block_active_params - LLAMA.norms_per_block * LLAMA.hidden
    assert mm == 2 * weights * t
    attention = next(k for k in fwd if k.cls == "attention")
    assert attention.flops == 4 * t * (s / 2) * LLAMA.heads * LLAMA.head_dim


def test_training_flops_per_token_are_6n_plus_attention():
    # MPT-7B: N counted without biases, norms and positions (no matmul touches them)
    d, L, V, s = 4096, 32, 50368, 2048
    n_matmul = 12 * d * d * L + V * d
    assert kernels.model_flops_per_token(MPT7, s) == pytest.approx(6 * n_matmul + 6 * s * d * L)


def test_backward_of_a_matmul_is_dgrad_and_wgrad_at_their_shapes():
    k = blocks.matmul("qkv", 8192, 12288, 4096, bias=True)
    dgrad, wgrad, bias = blocks.backward_of(k)
    assert (dgrad.m, dgrad.n, dgrad.k) == (8192, 4096, 12288)
    # the weight's gradient in the transposed weight's layout (n x k), as autograd writes it
    assert (wgrad.m, wgrad.n, wgrad.k) == (12288, 4096, 8192)
    assert dgrad.flops == wgrad.flops == k.flops
    assert bias.cls == "memory" and bias.bytes == 8192 * 12288 * 2
    att = next(x for x in blocks.block_forward(LLAMA, 1, 4096) if x.cls == "attention")
    assert blocks.backward_of(att)[0].flops == 2.5 * att.flops


def test_gpt_layout_block_is_fused_qkv_and_a_gelu_mlp():
    names = [k.name for k in blocks.block_forward(MPT7, 1, 2048)]
    assert names == ["norm", "qkv", "attention", "attn_out", "residual", "norm", "mlp_up", "gelu", "mlp_down",
                     "residual"]
    assert all(k.op == "addmm" for k in blocks.block_forward(MPT7, 1, 2048) if k.cls == "matmul")


@pytest.mark.parametrize("text, mode, fraction", [(True, "full", 1.0), (False, "none", 0.0), ("none", "none", 0.0),
                                                  ("full", "full", 1.0), ("blocks:0.5", "blocks", 0.5),
                                                  ("blocks:1", "full", 1.0), ("ops", "ops", 1.0)])
def test_checkpointing_modes_parse(text, mode, fraction):
    got = kernels.parse_checkpointing(text)
    assert (got.mode, got.fraction) == (mode, fraction)


@pytest.mark.parametrize("text", ["blocks:1.5", "blocks:0", "blocks:-1", "blocks:nan", "blocks:x", "sometimes"])
def test_a_bad_checkpointing_mode_is_refused_naming_it(text):
    with pytest.raises(UsageError, match="--activation-checkpointing"):
        kernels.parse_checkpointing(text)


def test_ops_recomputes_every_second_mm_and_no_attention_as_torchtitans_policy():
    fwd = blocks.block_forward(LLAMA, 1, 2048)
    again = kernels.recomputed(fwd, kernels.parse_checkpointing("ops"))
    assert [k.name for k in again if k.cls == "matmul"] == ["k", "attn_out", "mlp_up"]
    assert not [k for k in again if k.cls == "attention"]
    assert {k.name for k in again if k.cls == "memory"} == {k.name for k in fwd if k.cls == "memory"}
    # a biased linear is addmm: the policy neither saves nor counts it
    gpt = kernels.recomputed(blocks.block_forward(MPT7, 1, 2048), kernels.parse_checkpointing("ops"))
    assert [k.name for k in gpt if k.cls == "matmul"] == ["qkv", "attn_out", "mlp_up", "mlp_down"]


def test_full_and_blocks_recompute_the_forward_weighted_by_the_blocks_that_do():
    fwd = blocks.block_forward(LLAMA, 1, 2048)
    full = kernels.recomputed(fwd, kernels.parse_checkpointing("full"))
    half = kernels.recomputed(fwd, kernels.parse_checkpointing("blocks:0.5"))
    total = sum(k.total_flops for k in fwd)
    assert sum(k.total_flops for k in full) == total
    assert sum(k.total_flops for k in half) == 0.5 * total
    assert kernels.recomputed(fwd, kernels.parse_checkpointing("none")) == []


def test_activation_memory_per_mode_orders_none_blocks_ops_full():
    size = {m: kernels.activation_bytes(LLAMA, 2, 8192, kernels.parse_checkpointing(m))
            for m in ("none", "blocks:0.5", "ops", "full")}
    assert size["none"] > size["blocks:0.5"] > size["ops"] > size["full"]


def test_the_memory_check_follows_the_mode():
    train = fsdp.TrainSpec(ranks=8, micro_batch=2, seq_len=8192, flops_per_rank=4e14)
    none = fsdp.memory_check(LLAMA, train, 72e9).activation_bytes
    ops = fsdp.memory_check(LLAMA, replace(train, activation_checkpointing="ops"), 72e9).activation_bytes
    full = fsdp.memory_check(LLAMA, replace(train, activation_checkpointing=True), 72e9).activation_bytes
    assert none > ops > full


# ------------------------------------------------------------------ tables

def test_shipped_tables_load_with_a_source_per_class_and_implementation():
    for gpu in ("h100", "a100"):
        t = kernels.shipped(gpu)
        assert set(t.sources) == {"matmul", "attention", "memory", "overlap"} and all(t.sources.values())
        assert t.default_attention == "flash2"
        assert all(impl.source for impl in t.attention_impls.values())
    assert set(kernels.shipped("a100").attention_impls) == {"flash2", "flash1", "triton"}
    assert set(kernels.shipped("h100").attention_impls) == {"flash2", "flash1"}
    assert kernels.shipped("a100-40gb").gpu == "a100"
    assert kernels.shipped("b200") is None


def test_lookups_hit_grid_points_interpolate_between_and_hold_the_edges():
    t = kernels.shipped("h100")
    assert t.matmul(4096, 4096, 4096) == pytest.approx(783.3)
    lo, hi = t.matmul(4096, 1024, 4096), t.matmul(4096, 2048, 4096)
    assert lo < t.matmul(4096, 1448, 4096) < hi
    assert t.matmul(1 << 20, 1 << 16, 1 << 16) == t.matmul(16384, 4096, 4096)
    assert t.attention(2048, 128, causal=True, backward=False) == 298
    assert t.attention(65536, 128, causal=True, backward=False) == t.attention(16384, 128, True, False)


def _table_file(tmp_path, mutate):
    data = json.loads((tables.DATA / "h100.json").read_text())
    mutate(data)
    path = tmp_path / "table.json"
    path.write_text(json.dumps(data))
    return str(path)


@pytest.mark.parametrize("mutate, names", [
    (lambda d: d["matmul"]["tflops"][0][1].pop(), "matmul.tflops[0][1]"),
    (lambda d: d["matmul"]["tflops"][2][0].__setitem__(1, None), "matmul.tflops[2][0][1]"),
    (lambda d: d["attention"]["flash2"]["bwd_causal_tflops"][1].__setitem__(3, -5),
     "attention.flash2.bwd_causal_tflops[1][3]"),
    (lambda d: d["attention"]["flash1"].pop("fwd_tflops"), "attention.flash1.fwd_tflops"),
    (lambda d: d["attention"]["flash1"].pop("source"), "attention.flash1.source"),
    (lambda d: d["attention"].__setitem__("default", "triton"), "attention.default"),
    (lambda d: d["overlap"]["compute_rate"].pop("multi_node"), "overlap.compute_rate.multi_node"),
    (lambda d: d["overlap"]["compute_rate"].__setitem__("one_node", 1.2), "overlap.compute_rate.one_node"),
    (lambda d: d["memory"].pop("source"), "memory.source"),
    (lambda d: d["memory"].__setitem__("fraction_of_peak", 1.5), "memory.fraction_of_peak"),
])
def test_a_table_with_a_hole_is_refused_naming_the_entry(tmp_path, mutate, names):
    with pytest.raises(UsageError, match=names.replace("[", r"\[").replace("]", r"\]")):
        kernels.load_table(_table_file(tmp_path, mutate))


def test_attention_implementations_take_their_own_rates():
    a100 = kernels.shipped("a100")
    # the FlashAttention-2 paper's A100 figure: Triton and FA1 run causal head-dim-128 attention at
    # well under half of FA2's rate at 2k
    assert a100.attention(2048, 128, True, False, "triton") == 68
    assert a100.attention(2048, 128, True, False) == 155
    assert a100.attention(2048, 128, True, True, "flash1") == 69
    h100 = kernels.shipped("h100")
    assert h100.attention(2048, 128, True, False, "flash1") == 108


def test_an_implementation_the_table_lacks_is_priced_at_its_default_and_said_so():
    rates = kernels.TableRates(kernels.shipped("h100"), 3350.0, "triton")
    att = next(k for k in blocks.block_forward(MPT7, 1, 2048) if k.cls == "attention")
    default = kernels.TableRates(kernels.shipped("h100"), 3350.0).rate(att)[0]
    rate, source = rates.rate(att)
    assert rate == default and "triton: no h100 figure" in source and "flash2" in source


def test_a_table_of_one_attention_implementation_still_loads(tmp_path):
    data = json.loads((tables.DATA / "h100.json").read_text())
    data["attention"] = {**data["attention"]["flash2"], "implementation": "FlashAttention-2"}
    path = tmp_path / "flat.json"
    path.write_text(json.dumps(data))
    t = kernels.load_table(path)
    assert t.default_attention == "flashattention-2" and t.attention(2048, 128, True, False) == 298


def test_a_table_without_overlap_prices_no_contention(tmp_path):
    data = json.loads((tables.DATA / "h100.json").read_text())
    del data["overlap"]
    path = tmp_path / "no_overlap.json"
    path.write_text(json.dumps(data))
    t = kernels.load_table(path)
    assert t.overlap_rate(True) == 1.0 and kernels.overlap_loss(t, 4) == 0.0 and "overlap" not in t.sources
    a100 = kernels.shipped("a100")
    assert kernels.overlap_loss(a100, 1) == pytest.approx(24 / 108, abs=1e-4)
    assert kernels.overlap_loss(a100, 2) == pytest.approx(16 / 108, abs=1e-4)
    assert kernels.overlap_loss(None, 2) == 0.0


def test_a_non_finite_value_in_a_table_is_refused(tmp_path):
    path = tmp_path / "nan.json"
    path.write_text((tables.DATA / "h100.json").read_text().replace("783.3", "NaN", 1))
    with pytest.raises(UsageError, match="kernel table"):
        kernels.load_table(path)


# ------------------------------------------------------------------ pricing and calibration

def _priced(scale=1.0, mode="none", nodes=1):
    train = fsdp.TrainSpec(ranks=8 * nodes, micro_batch=2, seq_len=8192, flops_per_rank=1e15, grad_accum=1,
                           activation_checkpointing=mode, memory_gbps=3350.0)
    rates = kernels.TableRates(kernels.shipped("h100"), 3350.0)
    return kernels.priced_train(LLAMA, train, rates, scale)


def test_priced_step_breaks_down_by_class_with_sources():
    train = _priced(mode="ops")
    rows = {(r.cls, r.pass_): r for r in train.kernel_compute.rows}
    assert {"matmul", "attention", "memory", "fsdp copies"} <= {c for c, _ in rows}
    assert ("matmul", "recompute") in rows and ("attention", "recompute") not in rows
    assert "table h100 matmul" in rows[("matmul", "fwd")].as_dict()["source"]
    times = fsdp.compute_times(LLAMA, train)
    assert times["block_bwd"] > 2 * times["block_fwd"] * 0.9


def test_the_fused_loss_moves_a_seventh_of_the_eager_ones_bytes():
    eager = blocks.loss_kernel(4096, 50368, "eager")
    fused = blocks.loss_kernel(4096, 50368, "fused")
    assert eager.bytes == 14 * 4096 * 50368 and fused.bytes == 2 * 4096 * 50368
    assert fused.bytes * fused.bwd_factor == 4 * 4096 * 50368
    loss_rows = {t: {(r.cls, r.pass_): r.bytes for r in kernels.priced_compute(
        MPT7, fsdp.TrainSpec(ranks=8, micro_batch=2, seq_len=2048, flops_per_rank=1e15, loss_kernel=t),
        kernels.TableRates(kernels.shipped("h100"), 3350.0)).rows} for t in kernels.LOSSES}
    saved = (14 - 2 + 22 - 4) * 2 * 2048 * 50368
    fwd_bwd = {t: r[("memory", "fwd")] + r[("memory", "bwd")] for t, r in loss_rows.items()}
    # the eager count agrees per logit; the two losses' per-token terms (labels, log-sum-exp) differ
    assert fwd_bwd["eager"] - fwd_bwd["fused"] == pytest.approx(saved, rel=1e-4)


def test_compute_beside_a_collective_loses_its_share_only_while_they_overlap():
    assert fsdp.beside(10.0, 4.0, 0.0) == 10.0
    assert fsdp.beside(10.0, 4.0, 0.25) == pytest.approx(11.0)      # 4 s at 3/4 rate: 1 s lost
    assert fsdp.beside(2.0, 4.0, 0.25) == 4.0                         # the collective outlasts it
    assert fsdp.beside(3.0, 4.0, 0.25) == 4.0                         # 4 s at 3/4 rate does 3 s of compute
    net = synthetic_network("nvlink", 360.0, 0.0, "test")
    base = _priced()
    alone = fsdp.predict_step(LLAMA, base, net.all_gather, net.reduce_scatter)
    beside = fsdp.predict_step(LLAMA, replace(base, contention=0.4), net.all_gather, net.reduce_scatter)
    assert alone.step_s < beside.step_s < alone.step_s + 0.4 * (alone.allgather_fwd_s + alone.allgather_bwd_s +
                                                                  alone.reduce_scatter_s)
    one_rank = replace(base, ranks=1)
    assert (fsdp.predict_step(LLAMA, replace(one_rank, contention=0.4), net.all_gather, net.reduce_scatter).step_s
            == fsdp.predict_step(LLAMA, one_rank, net.all_gather, net.reduce_scatter).step_s)
    with pytest.raises(UsageError, match="beside collectives"):
        fsdp.predict_step(LLAMA, replace(base, contention=1.0), net.all_gather, net.reduce_scatter)


def test_the_optimizer_moves_the_bytes_its_implementation_moves():
    train = fsdp.TrainSpec(ranks=8, micro_batch=1, seq_len=2048, flops_per_rank=1e15, memory_gbps=3350.0)
    fused = fsdp.optimizer_s(MPT7, train)
    unfused = fsdp.optimizer_s(MPT7, replace(train, optimizer_bytes_per_param=96))
    assert fused == pytest.approx(MPT7.total_params / 8 * 28 / 3350e9)
    assert unfused == pytest.approx(fused * 96 / 28)


def test_the_a100_40gb_is_a_gpu_of_its_own_reading_the_a100_table():
    from microbench.compose.hardware import gpu

    g = gpu("a100-40gb")
    assert (g.memory_bytes, g.memory_gbps) == (40e9, 1555.0) and gpu("A100_40GB") is g
    assert kernels.shipped(g.name).gpu == "a100"


def test_the_scale_one_measured_step_gives_reproduces_it():
    net = synthetic_network("nvlink", 360.0, 0.0, "test")
    base = _priced()

    def step_at(scale):
        return fsdp.predict_step(LLAMA, replace(base, compute_scale=scale), net.all_gather, net.reduce_scatter).step_s

    measured = 1.3 * step_at(1.0)
    cal = kernels.calibrate(measured, "h100", {"nodes": 1}, step_at)
    assert step_at(cal.scale) == pytest.approx(measured, rel=1e-6)
    assert cal.scale < 1


@pytest.mark.parametrize("value", [0, -1, "nan", "inf", "x", None, True])
def test_a_bad_measured_step_is_refused(value):
    with pytest.raises(UsageError, match="--measured-step"):
        kernels.check_measured_step(value)


def test_a_step_shorter_than_the_communication_is_refused():
    with pytest.raises(UsageError, match="shorter than"):
        kernels.calibration.solve_scale(0.5, lambda s: 1.0 + 1.0 / s)


def test_a_calibration_from_another_gpu_kind_is_refused_naming_both():
    cal = kernels.read_calibration({"compute_scale": 0.7, "gpu": "h100", "measured_step_s": 2.8}, "cal.json")
    kernels.check_gpu(cal, "h100", "cal.json")
    with pytest.raises(UsageError, match="h100.*a100"):
        kernels.check_gpu(cal, "a100", "cal.json")


@pytest.mark.parametrize("summary", [None, {}, {"compute_scale": 0, "gpu": "h100"}, {"compute_scale": math.nan},
                                     {"compute_scale": 0.7}])
def test_a_record_without_a_compute_calibration_is_refused(summary):
    with pytest.raises(UsageError, match="--calibration"):
        kernels.read_calibration(summary, "cal.json")


# ------------------------------------------------------------------ a compute record's rates

def _record_rows(train):
    from microbench.probes.compute.kernel_cases import kernel_cases

    rows = []
    for c in kernel_cases(LLAMA, train.micro_batch, train.seq_len, "none"):
        row = {"op": c.op, "cls": c.cls, "per_block": c.per_block}
        if c.cls == "matmul":
            row.update(m=c.m, n=c.n, k=c.k, flops=c.flops, tflops=500.0)
        elif c.cls == "attention":
            row.update(seq_len=c.seq_len, head_dim=c.head_dim, causal=c.causal, flops=c.flops, tflops=250.0)
        else:
            row.update(bytes=c.bytes, gbps=2000.0)
        rows.append(row)
    return rows


def test_a_record_at_the_steps_shapes_prices_every_kernel_it_measured():
    train = fsdp.TrainSpec(ranks=8, micro_batch=1, seq_len=2048, flops_per_rank=1e15)
    rates = kernels.RecordRates(_record_rows(train), "c.json", kernels.TableRates(kernels.shipped("h100"), 3350.0))
    priced = kernels.priced_train(LLAMA, train, rates).kernel_compute
    matmul = next(r for r in priced.rows if (r.cls, r.pass_) == ("matmul", "fwd"))
    assert matmul.rate == pytest.approx(500e12) and matmul.sources == {"measured: c.json"}
    assert kernels.shapes_line(rates, "llama-3.1-8b", 1, 2048, "none") is None


def test_a_record_at_other_shapes_is_used_with_one_line_and_the_command():
    measured = fsdp.TrainSpec(ranks=8, micro_batch=1, seq_len=2048, flops_per_rank=1e15)
    target = replace(measured, micro_batch=2, seq_len=8192)
    rates = kernels.RecordRates(_record_rows(measured), "c.json", kernels.TableRates(kernels.shipped("h100"), 3350.0))
    priced = kernels.priced_train(LLAMA, target, rates).kernel_compute
    matmul = next(r for r in priced.rows if (r.cls, r.pass_) == ("matmul", "fwd"))
    assert matmul.rate == pytest.approx(500e12)
    line = kernels.shapes_line(rates, "llama-3.1-8b", 2, 8192, "none")
    assert "c.json" in line and "matmul" in line and "attention" in line
    assert "microbench compute --model llama-3.1-8b --micro-batch 2 --seq-len 8192" in line


def test_the_breakdown_names_each_rate_and_its_source():
    from microbench.compose.report import format_time

    headers, rows = kernels.breakdown_table(_priced(mode="full").kernel_compute, 1.25, format_time)
    assert headers[-1] == "rate from"
    assert rows[0][0] == "matmul" and "table h100 matmul" in rows[0][-1] and "x scale 1.25" in rows[0][-1]
    assert rows[-1][0] == "total compute"


def test_rates_follow_the_issues_order():
    from microbench.compose.hardware import GPUS

    table_rates, table = kernels.select_rates(GPUS["h100"])
    assert isinstance(table_rates, kernels.TableRates) and table.gpu == "h100"
    flat, none = kernels.select_rates(GPUS["h100"], tflops=400)
    assert none is None and flat.rate(blocks.matmul("x", 1, 1, 1))[0] == 400e12
    b200, _ = kernels.select_rates(GPUS["b200"], mfu=0.5)
    assert "no kernel table for b200" in b200.rate(blocks.matmul("x", 1, 1, 1))[1]
    measured, _ = kernels.select_rates(GPUS["h100"], record_rows=[{"op": "q", "cls": "matmul", "m": 1, "n": 1,
                                                                   "k": 1, "tflops": 100.0}], record_path="c.json")
    assert measured.rate(blocks.matmul("q", 1, 1, 1)) == (100e12, "measured: c.json")
    assert kernels.select_rates(None) == (None, None)
