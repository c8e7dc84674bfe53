"""Golden-input tests of the composer: synthetic curves with a known latency and bandwidth."""

import math

import pytest

from microbench.compose import (CheckpointSpec, CrudeModel, Curve, TrainSpec, checkpoint_bytes, checkpoint_parts, memory_check, predict_step, predict_tier, required_write_gbps, synthetic_network)
from microbench.compose.model import PRESETS
from microbench.compose.report import format_time
from microbench.core.errors import UsageError

LAT_S, BUSBW = 100e-6, 1.0  # 100 us, 1 GB/s


def record(op, ranks=2, sizes=(1 << 20, 4 << 20, 16 << 20, 64 << 20)):
    factor = (ranks - 1) / ranks
    rows = []
    for size in sizes:
        t = LAT_S + size * factor / (BUSBW * 1e9)
        algbw = size / t / 1e9
        rows.append({"op": op, "size_bytes": size, "placement": "out", "ranks": ranks,
                     "time_us": {"p50": t * 1e6}, "algbw_gbps": algbw, "busbw_gbps": algbw * factor})
    return {"rows": rows, "config": {"world": {"size": ranks}}}


def test_curve_recovers_the_model_it_was_built_from():
    curve = Curve.from_record(record("all_gather"), "all_gather")
    assert curve.latency_s == pytest.approx(LAT_S, rel=1e-6)
    assert curve.peak_busbw_gbps == pytest.approx(BUSBW, rel=1e-6)
    t, how = curve.time_s(4 << 20)
    assert how == "measured" and t == pytest.approx(LAT_S + (4 << 20) * 0.5 / 1e9)
    t, how = curve.time_s(1 << 30)
    assert how.startswith("extrapolated") and t == pytest.approx(LAT_S + (1 << 30) * 0.5 / 1e9, rel=1e-6)
    t, how = curve.time_s(8 << 20)
    assert how == "interpolated"
    assert curve.time_s(4 << 20)[0] < t < curve.time_s(16 << 20)[0]


def test_curve_rescales_to_another_world_size():
    curve = Curve.from_record(record("reduce_scatter"), "reduce_scatter")
    t, how = curve.time_s(64 << 20, ranks=8)
    assert "rescaled from 2 to 8" in how
    assert t == pytest.approx(LAT_S + (64 << 20) * 7 / 8 / 1e9, rel=1e-6)


def test_missing_op_names_what_the_record_has():
    with pytest.raises(UsageError, match="no 'all_gather' rows .*reduce_scatter"):
        Curve.from_record(record("reduce_scatter"), "all_gather")


@pytest.mark.parametrize("time_us", [None, {}, {"p50": 0}, {"p50": "12"}, {"p50": math.nan}], ids=repr)
def test_rows_of_the_op_without_a_time_are_not_called_missing(time_us):
    # It once said "has no 'all_gather' rows (it has: all_gather, ...)": the rows were there,
    # without a usable time.
    bad = record("all_gather")
    for row in bad["rows"]:
        row["time_us"] = time_us
    with pytest.raises(UsageError) as info:
        Curve.from_record(bad, "all_gather", "n.json")
    text = str(info.value)
    assert "has 4 'all_gather' row(s) but none with a measured time" in text and "has no" not in text


def test_checkpoint_bytes_and_tiers():
    spec = CheckpointSpec(params=1e9)
    assert checkpoint_bytes(spec) == 12e9  # fp32 master + two fp32 Adam moments
    tier = predict_tier("nvme", 12e9, write_gbps=3.0, read_gbps=6.0, fixed_s=1.0, staging_gbps=12.0, mtbf_s=86400)
    assert tier.save_s == pytest.approx(5.0)
    assert tier.load_s == pytest.approx(3.0)
    assert tier.async_blocked_s == pytest.approx(1.0)
    assert tier.young_daly_interval_s == pytest.approx(math.sqrt(2 * 5.0 * 86400))
    assert required_write_gbps(12e9, interval_s=600, overhead_fraction=0.02) == pytest.approx(1.0)


@pytest.mark.parametrize("call", [
    lambda: predict_tier("s3", 1e9, write_gbps=0),
    lambda: required_write_gbps(1e9, 0, 0.1),
    lambda: checkpoint_bytes(CheckpointSpec(1e9, optimizer="adam9")),
    lambda: predict_tier("nvme", 1e9, write_gbps=float("nan")),
    lambda: predict_tier("nvme", 1e9, write_gbps=1.0, read_gbps=float("inf")),
    lambda: predict_tier("nvme", 1e9, write_gbps=1.0, mtbf_s=0.0),
])
def test_bad_inputs_are_usage_errors(call):
    with pytest.raises(UsageError):
        call()


def test_tiers_from_storage_records_skip_memory_served_rows():
    from microbench.compose.tiers.records import tier_bandwidths

    posix = {"kind": "storage_posix", "rows": [
        {"op": "write", "write_gbps": 1.5}, {"op": "write", "write_gbps": 9.0, "served_from_memory": True},
        {"op": "read", "read_gbps": 3.0}]}
    assert tier_bandwidths(posix) == (1.5, 3.0)
    s3 = {"kind": "storage_s3", "rows": [{"op": "put", "throughput_gbps": 0.5}, {"op": "get", "throughput_gbps": 0.9}]}
    assert tier_bandwidths(s3) == (0.5, 0.9)
    with pytest.raises(UsageError, match="no write/put/save rows"):
        tier_bandwidths({"kind": "storage_posix", "rows": [{"op": "read", "read_gbps": 3.0}]}, "r.json")


# --------------------------------------------------------------------------- golden steps
# Hand-computed from the shapes (see tests/test_compose_models.py for the counts):
# llama-3.1-8b block = 4096*(4096+2*1024) + 4096*4096 + 3*4096*14336 + 2*4096 = 218,112,000 params;
# root = 2*128256*4096 + 4096 = 1,050,677,248; head matmul 128256*4096 + 4096 (final norm).
R = 400e12          # FLOP/s per rank
BW = 40e9           # bus bandwidth, B/s


def test_golden_llama_8b_step_on_16_ranks():
    model = PRESETS["llama-3.1-8b"]
    assert model.block_params == 218_112_000 and model.root_params == 1_050_677_248
    train = TrainSpec(ranks=16, micro_batch=1, seq_len=4096, flops_per_rank=R, memory_gbps=3350)
    net = synthetic_network("ib", 40.0, 0.0, "ib=40GB/s")
    p = predict_step(model, train, net.all_gather, net.reduce_scatter)
    f = 15 / 16
    cf = (2 * 218_112_000 * 4096 + 2 * 4096 * 4096 * 32 * 128) / R       # 4.80 ms
    cb = 2 * cf
    ag = rs = 218_112_000 * 2 * f / BW                                      # 10.2 ms: comm-bound
    ag_root = rs_root = 1_050_677_248 * 2 * f / BW
    head_f = 2 * (128256 * 4096 + 4096) * 4096 / R
    opt = 8_030_261_248 / 16 * 28 / 3350e9
    expected = (ag_root + ag + 31 * max(cf, ag) + cf + head_f
                + max(2 * head_f, ag) + 31 * max(cb, ag + rs) + cb + rs + rs_root + opt)
    assert cf < ag and cb < ag + rs
    assert p.step_s == pytest.approx(expected, rel=1e-9)
    assert p.compute_s == pytest.approx(32 * 3 * cf + 3 * head_f)
    assert p.allgather_bwd_s == pytest.approx(32 * ag)
    assert p.full_overlap_s <= p.step_s <= p.no_overlap_s
    assert p.tokens_per_s == pytest.approx(16 * 4096 / expected)
    # compute-bound once the backward's ag + rs fit in cb: 2 x 436 MB x 15/16 / cb
    assert p.breakeven_busbw_gbps == pytest.approx(max(218_112_000 * 2 * f / cf, 2 * 218_112_000 * 2 * f / cb) / 1e9)


def test_attention_flops_causal_and_sliding_window():
    from microbench.compose.fsdp import attention_flops_fwd_per_layer

    train = TrainSpec(ranks=8, micro_batch=1, seq_len=8192, flops_per_rank=R)
    # llama: every query sees s/2 keys on average; QK^T and AV at 2 FLOPs per multiply-add
    assert attention_flops_fwd_per_layer(PRESETS["llama-3.1-8b"], train) == 4 * 8192 * 4096 * 32 * 128
    # mistral: a 4096 window over 8192 tokens: 4096 x (1 - 4096 / 16384) = 3072 keys on average
    assert attention_flops_fwd_per_layer(PRESETS["mistral-7b"], train) == 4 * 8192 * 3072 * 32 * 128
    # gemma-3: 40 of 48 layers with a 1024 window (960 keys), 8 global (4096 keys)
    gemma = attention_flops_fwd_per_layer(PRESETS["gemma-3-12b"], train)
    assert gemma == pytest.approx(4 * 8192 * (40 * 960 + 8 * 4096) / 48 * 16 * 256)


def test_golden_mixtral_moves_every_expert_and_computes_with_two():
    model = PRESETS["mixtral-8x7b"]
    # block: attention 41,943,040 + router 4096*8 + 8 experts * 3*4096*14336 + 2 norms * 4096
    assert model.block_params == 41_943_040 + 32_768 + 8 * 176_160_768 + 8192
    assert model.block_active_params == 41_943_040 + 32_768 + 2 * 176_160_768 + 8192
    train = TrainSpec(ranks=64, micro_batch=2, seq_len=4096, flops_per_rank=R, grad_accum=2,
                      activation_checkpointing=True, reshard_after_forward=False)
    net = synthetic_network("ib", 400.0, 20e-6, "ib=400GB/s@20us")
    p = predict_step(model, train, net.all_gather, net.reduce_scatter)
    f, T = 63 / 64, 8192
    cf = (2 * 394_305_536 * T + 2 * T * 4096 * 32 * 128) / R
    cb = 2 * cf + cf                                                       # recompute
    ag = 20e-6 + 1_451_270_144 * 2 * f / 400e9
    rs = 20e-6 + 1_451_270_144 * 2 * f / 400e9
    root = 2 * 32000 * 4096 + 4096
    ag_root = rs_root = 20e-6 + root * 2 * f / 400e9
    head_f = 2 * (32000 * 4096 + 4096) * T / R
    fwd = ag_root + ag + 31 * max(cf, ag) + cf + head_f
    bwd = head_f * 2 + 31 * max(cb, rs) + cb + rs + rs_root                # no gather in backward
    assert p.step_s == pytest.approx(2 * fwd + 2 * bwd, rel=1e-9)
    assert p.allgather_bwd_s == 0 and p.optimizer_s == 0                   # no --gpu: no HBM bandwidth
    assert p.reduce_scatter_s == pytest.approx(2 * (32 * rs + rs_root))


def test_crude_model_keeps_the_old_two_number_behaviour():
    ag = Curve.from_record(record("all_gather"), "all_gather")
    rs = Curve.from_record(record("reduce_scatter"), "reduce_scatter")
    model = CrudeModel("m", params=1e8, layers=10)
    p = predict_step(model, TrainSpec(ranks=2, micro_batch=1, seq_len=4096, flops_per_rank=1e12), ag, rs)
    c_f, c_b = 2 * 1e7 * 4096 / 1e12, 4 * 1e7 * 4096 / 1e12
    t_ag, t_rs = ag.time_s(2e7)[0], rs.time_s(2e7)[0]
    assert c_b > t_ag + t_rs
    assert p.step_s == pytest.approx(t_ag + 10 * c_f + t_ag + 10 * c_b + t_rs)
    assert p.exposed_comm_s == pytest.approx(2 * t_ag + t_rs)


def test_overlap_zero_is_the_no_overlap_bound():
    model = PRESETS["mistral-7b"]
    net = synthetic_network("eth", 1.0, 0.0, "eth=1GB/s")
    p = predict_step(model, TrainSpec(ranks=8, micro_batch=1, seq_len=2048, flops_per_rank=R, overlap=0.0),
                     net.all_gather, net.reduce_scatter)
    assert p.step_s == pytest.approx(p.no_overlap_s)


def test_fsdp_unit_overhead_is_never_hidden():
    model = PRESETS["llama-3.1-8b"]
    net = synthetic_network("ib", 400.0, 0.0, "ib=400GB/s")
    base = TrainSpec(ranks=8, micro_batch=1, seq_len=4096, flops_per_rank=R, grad_accum=2)
    with_overhead = TrainSpec(ranks=8, micro_batch=1, seq_len=4096, flops_per_rank=R, grad_accum=2,
                              unit_overhead_s=200e-6)
    a = predict_step(model, base, net.all_gather, net.reduce_scatter)
    b = predict_step(model, with_overhead, net.all_gather, net.reduce_scatter)
    # 2 micro-batches x 2 passes x (32 blocks + the root)
    assert b.fsdp_overhead_s == pytest.approx(2 * 2 * 33 * 200e-6)
    assert b.step_s - a.step_s == pytest.approx(b.fsdp_overhead_s)
    assert b.no_overlap_s - a.no_overlap_s == pytest.approx(b.fsdp_overhead_s)


def test_memory_check_says_when_a_model_does_not_fit():
    big = memory_check(PRESETS["llama-3.1-70b"], TrainSpec(ranks=16, micro_batch=1, seq_len=4096,
                                                           flops_per_rank=R), 72e9)
    # fp32 params + grads + AdamW = 16 bytes/param over 16 ranks: 70.6 GB before any activation
    assert big.sharded_state_bytes == pytest.approx(70_553_706_496)
    assert big.fits is False
    small = memory_check(PRESETS["llama-3.1-8b"], TrainSpec(ranks=16, micro_batch=1, seq_len=4096,
                                                            flops_per_rank=R, activation_checkpointing=True), 72e9)
    assert small.fits is True and small.activation_bytes == small.activation_bytes_ac < small.activation_bytes_no_ac


def test_golden_checkpoint_for_llama_8b():
    parts = checkpoint_parts(8_030_261_248)
    assert parts["training_checkpoint_bytes"] == 12 * 8_030_261_248
    assert parts["weights_bytes"] == 2 * 8_030_261_248
    tier = predict_tier("nvme", parts["training_checkpoint_bytes"], write_gbps=6, read_gbps=12,
                        staging_gbps=64 * 16, mtbf_s=24 * 3600)
    assert tier.save_s == pytest.approx(96.363134976 / 6)
    assert tier.load_s == pytest.approx(96.363134976 / 12)
    assert tier.async_blocked_s == pytest.approx(96.363134976 / (64 * 16))
    assert tier.young_daly_interval_s == pytest.approx(math.sqrt(2 * 96.363134976 / 6 * 86400))


def test_golden_checkpoint_for_mixtral_counts_every_expert():
    total = 46_702_792_704          # all experts are saved, whatever top-k computes
    parts = checkpoint_parts(PRESETS["mixtral-8x7b"].total_params)
    assert parts["training_checkpoint_bytes"] == 12 * total
    tier = predict_tier("s3", parts["training_checkpoint_bytes"], write_gbps=1.5, read_gbps=3.0, mtbf_s=12 * 3600)
    assert tier.save_s == pytest.approx(560.433512448 / 1.5)      # 6.2 min
    assert tier.load_s == pytest.approx(560.433512448 / 3.0)
    assert tier.young_daly_interval_s == pytest.approx(math.sqrt(2 * 560.433512448 / 1.5 * 43200))
    assert format_time(tier.save_s) == "6.2 min"


@pytest.mark.parametrize("seconds, text", [(2.52605e3, "42.1 min"), (2526.05e3, "29.2 days"), (0.0123, "12.3 ms"),
                                           (4.5e-5, "45 us"), (3.0, "3.00 s"), (7200 * 2, "4.0 h")])
def test_times_are_formatted_for_reading(seconds, text):
    assert format_time(seconds) == text and "e+" not in format_time(seconds)


# --------------------------------------------------------------------------- the command

def nccl_file(tmp_path, name="n.json", status="complete", kind="nccl", backend="gloo"):
    from microbench.results import RecordWriter, new_record

    rec = new_record(kind, {}, {}, {"backend": backend, "device": "cpu" if backend == "gloo" else "cuda"})
    rec["rows"] = record("all_gather")["rows"] + record("reduce_scatter")["rows"]
    return str(RecordWriter(rec, tmp_path / name).finish(status))


ACCEPTANCE = ("compose", "--model", "llama-3.1-8b", "--nodes", "2", "--gpus-per-node", "8", "--gpu", "h100",
              "--micro-batch", "1", "--seq-len", "4096", "--net", "eth=1.6GB/s", "--net", "ib=40GB/s",
              "--tier", "nvme=6:12", "--tier", "s3=1.5:3")


def test_acceptance_command_prints_both_networks_the_checkpoint_and_memory_and_writes_a_record(cli, tmp_path):
    import json

    done = cli(*ACCEPTANCE, "--mtbf-hours", "24", "--csv", "out.csv")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "## what-if: network x step" in out and "## memory per GPU" in out and "# fits:" in out
    assert "nvme" in out and "s3" in out and "Young/Daly" in out
    assert "e+0" not in out
    path = out.strip().splitlines()[-1].split("record: ")[1]
    rec = json.loads((tmp_path / path).read_text())
    assert rec["kind"] == "compose" and rec["status"] == "complete"
    steps = {r["network"]: r for r in rec["rows"] if r["op"] == "step"}
    assert set(steps) == {"eth", "ib"} and steps["eth"]["step_s"] > steps["ib"]["step_s"] > 0
    assert rec["config"]["model"]["total_params"] == PRESETS["llama-3.1-8b"].total_params
    assert [n["source"] for n in rec["config"]["networks"]] == ["--net eth=1.6GB/s", "--net ib=40GB/s"]
    assert (tmp_path / "out.csv").read_text().count("\n") == 5   # header + 2 steps + 2 tiers


def test_model_config_gives_the_presets_count_through_the_command(tmp_path):
    from microbench.cli import main

    cfg = str(__import__("pathlib").Path(__file__).parent / "data" / "hf" / "llama-3.1-8b.config.json")
    for flags in (("--model-config", cfg), ("--model", "llama-3.1-8b")):
        path = tmp_path / f"{len(flags[0])}.json"
        assert main(["compose", *flags, "--ranks", "8", "--gpu", "a100", "--net", "ib=40GB/s",
                     "--json", str(path)]) == 0
        import json
        assert json.loads(path.read_text())["config"]["model"]["total_params"] == 8_030_261_248


def test_a_model_that_does_not_fit_is_flagged_not_hidden(capsys, tmp_path):
    from microbench.cli import main

    assert main(["compose", "--model", "llama-3.1-70b", "--ranks", "8", "--gpu", "h100", "--net", "ib=40GB/s",
                 "--results-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "# DOES NOT FIT" in out and "[DOES NOT FIT in memory" in out and "step (overlapped)" in out


def test_gloo_record_gets_a_warning_and_rescale_note(capsys, tmp_path):
    from microbench.cli import main

    suite = tmp_path / "suite-1"
    suite.mkdir()
    nccl_file(suite, "collectives.json")
    assert main(["compose", "--model", "mistral-7b", "--nccl", f"lab={suite}", "--ranks", "16", "--gpu", "h100",
                 "--results-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "# warning: lab: " in out and "gloo on cpu" in out
    assert "rescaled from 2 to 16 ranks" in out


def test_calibration_record_sets_overlap_and_overhead(tmp_path, capsys):
    import json

    from microbench.cli import main
    from microbench.results import RecordWriter, new_record

    rec = new_record("verify", {}, {}, {})
    rec["summary"] = {"calibration": {"overlap": 0.25, "unit_overhead_s": 300e-6, "backend": "gloo"}}
    cal = str(RecordWriter(rec, tmp_path / "cal.json").finish("complete"))
    assert main(["compose", "--gpu", "h100", "--ranks", "8", "--net", "ib=40GB/s", "--calibration", cal,
                 "--json", str(tmp_path / "p.json")]) == 0
    out = capsys.readouterr().out
    assert "overlap 0.25, FSDP overhead 300 us per unit per pass" in out
    train = json.loads((tmp_path / "p.json").read_text())["config"]["train"]
    assert train["overlap"] == 0.25 and train["unit_overhead_s"] == 300e-6
    assert main(["compose", "--gpu", "h100", "--ranks", "8", "--net", "ib=40GB/s", "--calibration", cal,
                 "--overlap", "1", "--results-dir", str(tmp_path)]) == 0
    assert "overlap 1, " in capsys.readouterr().out


def test_a_partial_record_is_used_only_when_allowed_and_then_said(tmp_path, capsys):
    from microbench.cli import main

    path = nccl_file(tmp_path, "partial.json", status="partial")
    assert main(["compose", "--gpu", "h100", "--nccl", path, "--allow-partial", "--results-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "# warning: partial: " in out and "is a partial record (--allow-partial)" in out
    assert "e+0" not in out


def bad_inputs(tmp):
    import json

    listing = tmp / "list.json"
    listing.write_text("[1, 2]")
    rows = json.loads(open(nccl_file(tmp, "ok.json")).read())
    rows["rows"] = [1, "x"]
    (tmp / "rows.json").write_text(json.dumps(rows))
    old = dict(rows, rows=[], schema_version=99)
    (tmp / "old.json").write_text(json.dumps(old))
    (tmp / "cfg.json").write_text("{oops")
    (tmp / "nofield.json").write_text(json.dumps({"hidden_size": 64}))
    nccl_file(tmp, "partial.json", status="partial")
    nccl_file(tmp, "storage.json", kind="storage_posix")
    net = ["--net", "ib=40GB/s", "--ranks", "8"]
    gpu = ["--gpu", "h100"]
    return {
        "tflops nan": (["--tflops", "nan", *net], "invalid --tflops 'nan': expected a finite number"),
        "tflops inf": (["--tflops", "inf", *net], "invalid --tflops 'inf': expected a finite number"),
        "params nan": (["--params", "nan", "--layers", "32", "--tflops", "400", *net], "invalid --params 'nan'"),
        "params 1e30": (["--params", "1e30", "--layers", "32", "--tflops", "400", *net], "must be at most 1e+15"),
        "tier nan": ([*gpu, *net, "--tier", "nvme=nan"], "invalid --tier 'nvme=nan': the write bandwidth 'nan'"),
        "tier inf": ([*gpu, *net, "--tier", "nvme=6:inf"], "invalid --tier 'nvme=6:inf': the read bandwidth 'inf'"),
        "tier word": ([*gpu, *net, "--tier", "nvme=fast"], "must be a positive finite number of GB/s, e.g. --tier nvme=6:12"),
        "mtbf -1": ([*gpu, *net, "--mtbf-hours", "-1"], "invalid --mtbf-hours '-1': must be more than 0"),
        "mtbf 0": ([*gpu, *net, "--mtbf-hours", "0"], "invalid --mtbf-hours '0'"),
        "mtbf 0 tier": ([*gpu, *net, "--mtbf-hours", "0", "--tier", "nvme=6"], "invalid --mtbf-hours '0'"),
        "nccl list": ([*gpu, "--nccl", str(listing)], "holds a JSON list, not an object"),
        "nccl rows": ([*gpu, "--nccl", str(tmp / "rows.json")], "rows are not a list of objects"),
        "storage list": ([*gpu, *net, "--storage", str(listing)], "holds a JSON list, not an object"),
        "storage rows": ([*gpu, *net, "--storage", str(tmp / "rows.json")], "rows are not a list of objects"),
        "schema": ([*gpu, "--nccl", str(tmp / "old.json")], "schema_version 99 is not supported"),
        "wrong kind": ([*gpu, "--nccl", str(tmp / "storage.json")], "is a 'storage_posix' record; expected"),
        "partial": ([*gpu, "--nccl", str(tmp / "partial.json")], "or pass --allow-partial"),
        "unknown model": ([*gpu, *net, "--model", "gpt-5"], "expected one of llama-3.1-8b"),
        "unknown gpu": (["--gpu", "h800", *net], "unknown --gpu 'h800': expected one of h100, h200"),
        "config not json": ([*gpu, *net, "--model-config", str(tmp / "cfg.json")], "is not JSON"),
        "config field": ([*gpu, *net, "--model-config", str(tmp / "nofield.json")], "lacks the field"),
        "ranks vs nodes": ([*gpu, "--net", "ib=40GB/s", "--ranks", "10", "--nodes", "4"], "does not divide"),
        "micro-batch 0": ([*gpu, *net, "--micro-batch", "0"], "invalid --micro-batch '0'"),
        "seq-len -1": ([*gpu, *net, "--seq-len", "-1"], "invalid --seq-len '-1'"),
        "mfu 0": ([*gpu, *net, "--mfu", "0"], "invalid --mfu '0'"),
        "net no unit": ([*gpu, "--net", "ib=40", "--ranks", "8"], "expected a number with a unit"),
        "net bad latency": ([*gpu, "--net", "ib=40GB/s@fast", "--ranks", "8"], "latency 'fast'"),
        "no network": ([*gpu, "--ranks", "8"], "no network to predict over"),
        "no compute": ([*net], "no compute rate"),
        "ckpt overhead": ([*gpu, *net, "--ckpt-overhead", "150%"], "invalid --ckpt-overhead '150%': must be less than 100"),
        "ckpt interval": ([*gpu, *net, "--ckpt-interval", "0s"], "invalid --ckpt-interval '0s'"),
        "nodes 0": ([*gpu, "--net", "ib=40GB/s", "--nodes", "0"], "invalid --nodes '0'"),
        "overlap 2": ([*gpu, *net, "--overlap", "2"], "invalid --overlap '2': must be at most 1"),
        "params negative": (["--params", "-5", "--layers", "2", *gpu, *net], "invalid --params '-5'"),
        "net negative": ([*gpu, "--net", "ib=-40GB/s", "--ranks", "8"], "invalid --net ib bus bandwidth '-40GB/s'"),
        "ranks vs gpus": ([*gpu, "--net", "ib=40GB/s", "--ranks", "8", "--nodes", "2", "--gpus-per-node", "8"],
                          "--ranks 8 disagrees with --nodes 2 x --gpus-per-node 8"),
        "layers alone": ([*gpu, *net, "--layers", "32"], "--params and --layers go together"),
        "calibration kind": ([*gpu, *net, "--calibration", str(tmp / "ok.json")], "without summary.calibration"),
        "names repeat": ([*gpu, "--nccl", str(tmp / "ok.json"), "--nccl", str(tmp / "ok.json")],
                         "network names repeat (ok, ok)"),
        "unit overhead": ([*gpu, *net, "--unit-overhead", "-1us"], "invalid --unit-overhead '-1us': must be at least 0"),
    }


CASES = ["tflops nan", "tflops inf", "params nan", "params 1e30", "tier nan", "tier inf", "tier word", "mtbf -1",
         "mtbf 0", "mtbf 0 tier", "nccl list", "nccl rows", "storage list", "storage rows", "schema", "wrong kind",
         "partial", "unknown model", "unknown gpu", "config not json", "config field", "ranks vs nodes",
         "micro-batch 0", "seq-len -1", "mfu 0", "net no unit", "net bad latency", "no network", "no compute",
         "ckpt overhead", "ckpt interval", "nodes 0", "overlap 2", "params negative", "net negative", "ranks vs gpus",
         "layers alone", "calibration kind", "unit overhead", "names repeat"]


@pytest.mark.parametrize("case", CASES)
def test_bad_input_is_exit_2_with_one_line(case, tmp_path, capsys):
    from microbench.cli import main

    argv, message = bad_inputs(tmp_path)[case]
    rc = main(["compose", *argv, "--results-dir", str(tmp_path / "results")])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert message in err
    assert not (tmp_path / "results").exists()


def test_existing_json_or_csv_is_refused_before_anything(tmp_path, capsys):
    from microbench.cli import main

    (tmp_path / "have.csv").write_text("x")
    rc = main(["compose", "--gpu", "h100", "--net", "ib=40GB/s", "--ranks", "8", "--csv", str(tmp_path / "have.csv")])
    assert rc == 2 and "already exists" in capsys.readouterr().err


# --------------------------------------------------------------------------- the schedule

def test_the_schedule_is_what_predict_step_prices():
    """FSDP2's collectives per micro-batch, in order: root and blocks gathered for forward, each
    block gathered again and reduce-scattered in backward, the root last; the step's
    communication totals are those collectives' times on the curve."""
    from microbench.compose.fsdp import schedule, unit_bytes

    model = PRESETS["llama-3.1-8b"]
    plan = schedule(model.layers)
    assert [(c.op, c.unit) for c in plan[:2]] == [("all_gather", "root"), ("all_gather", "block")]
    assert [(c.op, c.phase) for c in plan[model.layers + 1:model.layers + 3]] == [
        ("all_gather", "backward"), ("reduce_scatter", "backward")]
    assert (plan[-1].op, plan[-1].unit) == ("reduce_scatter", "root")
    train = TrainSpec(ranks=8, micro_batch=1, seq_len=4096, flops_per_rank=400e12)
    net = synthetic_network("ib", 40.0, 30e-6, "ib=40GB/s@30us")
    pred = predict_step(model, train, net.all_gather, net.reduce_scatter)

    def total(phase, op):
        curve = net.all_gather if op == "all_gather" else net.reduce_scatter
        return sum(curve.time_s(unit_bytes(model, c.unit, c.op, "bfloat16", "bfloat16"), 8)[0]
                   for c in plan if c.phase == phase and c.op == op)

    assert pred.allgather_fwd_s == pytest.approx(total("forward", "all_gather"))
    assert pred.allgather_bwd_s == pytest.approx(total("backward", "all_gather"))
    assert pred.reduce_scatter_s == pytest.approx(total("backward", "reduce_scatter"))


def test_the_schedule_without_reshard_and_with_replicas():
    from microbench.compose.fsdp import schedule

    kept = schedule(4, reshard_after_forward=False)
    assert sum(c.op == "all_gather" for c in kept) == 5 and sum(c.op == "reduce_scatter" for c in kept) == 5
    hsdp = schedule(4, replicas=True)
    after = [(a.op, b.op, a.unit) for a, b in zip(hsdp, hsdp[1:]) if a.op == "reduce_scatter"]
    assert after == [("reduce_scatter", "all_reduce", "block")] * 4 + [("reduce_scatter", "all_reduce", "root")]
