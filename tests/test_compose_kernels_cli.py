"""`microbench compose` with compute priced per kernel: the issue's acceptance commands (the
per-class breakdown with each rate's source; a measured step, then its calibration on 16 nodes),
the checkpointing modes, deferred gradient sync, the attention kernel, a compute record at other
shapes, and every bad input refused with exit 2 and one line before any output."""

from __future__ import annotations

import json
import math

import pytest

from microbench.cli import main
from microbench.compose.kernels.tables import DATA
from microbench.results import new_record

ACCEPT = ["--model", "llama-3.1-8b", "--gpus-per-node", "8", "--gpu", "h100", "--micro-batch", "2", "--seq-len", "8192"]
NETS = ["--net-intra", "360GB/s", "--net-inter", "ib=400GB/s"]


def _compose(argv, tmp_path, capsys, name="out.json"):
    rc = main(["compose", *argv, "--json", str(tmp_path / name)])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err, (json.loads((tmp_path / name).read_text()) if rc == 0 else None)


def test_the_breakdown_names_each_class_its_rate_and_where_it_came_from(tmp_path, capsys):
    rc, out, err, rec = _compose([*ACCEPT, "--nodes", "16", "--activation-checkpointing", "ops", *NETS], tmp_path, capsys)
    assert rc == 0, err
    assert "## compute per kernel class" in out and "checkpointing ops" in out
    for source in ("table h100 matmul", "table h100 attention flash2 fwd", "table h100 memory 0.884 x peak"):
        assert source in out
    assert "# memory-bound bytes per unit: blocks: counted llama/bf16/sdpa/nobias/gqa" in out
    assert "# matmul rates: OpenXLA" in out and "activation checkpointing ops" in out
    compute = rec["summary"]["compute"]
    classes = {(r["class"], r["pass"]) for r in compute["breakdown"]}
    assert {("matmul", "fwd"), ("matmul", "recompute"), ("attention", "bwd"), ("memory", "bwd")} <= classes
    assert ("attention", "recompute") not in classes        # the ops policy keeps attention's output
    assert all(r["source"] for r in compute["breakdown"]) and compute["compute_scale"] == 1


def test_a_measured_step_gives_the_scale_and_its_record_calibrates_16_nodes(tmp_path, capsys):
    rc, out, err, one = _compose([*ACCEPT, "--nodes", "1", "--measured-step", "2.8"], tmp_path, capsys, "cal.json")
    assert rc == 0, err
    cal = one["summary"]["calibration"]
    assert cal["gpu"] == "h100" and cal["measured_step_s"] == 2.8 and 0 < cal["compute_scale"] < 1
    assert f"every compute rate x {cal['compute_scale']:.3g} reproduces it" in out
    assert "# network: none named: assumed an HGX H100/H200 node" in out
    step = next(r for r in one["rows"] if r["op"] == "step")
    assert step["step_s"] == pytest.approx(2.8, rel=1e-6)
    rc, out, err, many = _compose([*ACCEPT, "--nodes", "16", "--calibration", str(tmp_path / "cal.json")], tmp_path,
                                  capsys, "many.json")
    assert rc == 0, err
    assert f"compute rates x {cal['compute_scale']:.3g}, the scale --calibration" in out
    assert many["summary"]["compute"]["compute_scale"] == pytest.approx(cal["compute_scale"])
    assert many["summary"]["compute"]["scale_from"] == str(tmp_path / "cal.json")


@pytest.mark.parametrize("argv, mode", [(["--activation-checkpointing"], "full"),
                                        (["--activation-checkpointing", "blocks:0.5"], "blocks:0.5"),
                                        ([], "none")])
def test_checkpointing_modes_and_the_bare_flag(argv, mode, tmp_path, capsys):
    rc, out, err, rec = _compose([*ACCEPT, "--nodes", "2", *NETS, *argv], tmp_path, capsys)
    assert rc == 0, err
    assert f"activation checkpointing {mode}," in out
    assert rec["summary"]["compute"]["checkpointing"] == mode


def test_deferred_gradient_sync_reduce_scatters_once(tmp_path, capsys):
    base = [*ACCEPT, "--nodes", "2", *NETS, "--grad-accum", "4", "--activation-checkpointing"]
    _, out, _, every = _compose(base, tmp_path, capsys, "every.json")
    assert "ReduceScatter every micro-batch" in out
    rc, out, err, once = _compose([*base, "--defer-grad-sync"], tmp_path, capsys, "once.json")
    assert rc == 0, err
    assert "ReduceScatter once, on the last micro-batch" in out
    assert once["summary"]["compute"]["gradient_sync"] == "last micro-batch"
    rs = [next(r for r in rec["rows"] if r["op"] == "step")["reduce_scatter_s"] for rec in (every, once)]
    assert rs[1] == pytest.approx(rs[0] / 4)


def test_an_attention_kernel_the_table_lacks_is_priced_at_its_default_and_said(tmp_path, capsys):
    rc, out, err, _ = _compose([*ACCEPT, "--nodes", "2", *NETS, "--attention-impl", "triton"], tmp_path, capsys)
    assert rc == 0, err
    assert "table h100 attention flash2 (triton: no h100 figure in the table)" in out


def _compute_record(tmp_path, micro_batch, seq_len):
    from microbench.probes.compute.kernel_cases import kernel_cases
    from microbench.compose.model import PRESETS

    rows = []
    timed = {"p50": 1.0, "p95": 1.0, "p99": 1.0, "max": 1.0, "min": 1.0, "mean": 1.0, "n": 1}
    for c in kernel_cases(PRESETS["llama-3.1-8b"], micro_batch, seq_len, "none"):
        row = {"probe": "compute", "op": c.op, "size_bytes": 0, "iters": 1, "warmup": 0, "time_us": timed,
               "slowest_rank": 0, "per_rank_time_us_p50": [1.0], "nwrong": None, "dtype": "bfloat16",
               "cls": c.cls, "per_block": c.per_block}
        if c.cls == "matmul":
            row.update(m=c.m, n=c.n, k=c.k, flops=int(c.flops), tflops=600.0)
        elif c.cls == "attention":
            row.update(seq_len=c.seq_len, head_dim=c.head_dim, causal=c.causal, flops=int(c.flops), tflops=300.0)
        else:
            row.update(bytes=int(c.bytes), gbps=2500.0)
        rows.append(row)
    rec = new_record("compute", {"model": "llama-3.1-8b"}, {}, {"device": "cuda", "gpu": "NVIDIA H100 80GB HBM3"})
    rec.update(status="complete", rows=rows, summary={"achieved_tflops": 600.0, "model": "llama-3.1-8b"})
    path = tmp_path / "compute.json"
    path.write_text(json.dumps(rec))
    return str(path)


def test_a_compute_record_at_other_shapes_is_used_with_one_line_and_the_command(tmp_path, capsys):
    record = _compute_record(tmp_path, 1, 2048)
    rc, out, err, rec = _compose([*ACCEPT, "--nodes", "2", *NETS, "--compute", record], tmp_path, capsys)
    assert rc == 0, err
    line = next(x for x in out.splitlines() if "was not measured at this step's shapes" in x)
    assert "microbench compute --model llama-3.1-8b --micro-batch 2 --seq-len 8192" in line
    assert any("measured: " in r["source"] for r in rec["summary"]["compute"]["breakdown"])


def _table(tmp_path, name, edit):
    data = json.loads((DATA / "h100.json").read_text())
    edit(data)
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return str(path)


def _compose_record(tmp_path, name, summary):
    rec = new_record("compose", {}, {}, {"name": "python"})
    rec.update(status="complete", rows=[], summary=summary)
    (tmp_path / name).write_text(json.dumps(rec))
    return str(tmp_path / name)


def bad(tmp_path):
    a100 = _compose_record(tmp_path, "a100.json", {"calibration": {"compute_scale": 0.7, "gpu": "a100",
                                                                   "measured_step_s": 3.0}})
    plain = _compose_record(tmp_path, "plain.json", {})
    one = [*ACCEPT, "--nodes", "1"]
    hole = _table(tmp_path, "hole.json", lambda d: d["matmul"]["tflops"][0][0].__setitem__(0, None))
    return {
        "measured 0": ([*one, "--measured-step", "0"], "invalid --measured-step '0'"),
        "measured negative": ([*one, "--measured-step", "-2.8"], "invalid --measured-step '-2.8'"),
        "measured nan": ([*one, "--measured-step", "nan"], "invalid --measured-step 'nan'"),
        "measured no gpu": (["--tflops", "400", "--nodes", "1", "--measured-step", "2.8", *NETS],
                            "name the GPU it was measured on"),
        "measured no configuration": (["--gpu", "h100", "--measured-step", "2.8", "--net", "ib=40GB/s"],
                                      "needs the configuration it was measured on"),
        "measured two networks": ([*one, "--measured-step", "2.8", "--net", "a=40GB/s", "--net", "b=80GB/s"],
                                  "was measured on one network; 2 are given"),
        "measured too short": ([*one, "--measured-step", "1e-9"], "shorter than this configuration's communication"),
        "calibration other gpu": ([*one, "--calibration", a100], "was measured on a100, not on --gpu h100"),
        "calibration without one": ([*one, "--calibration", plain], "has no compute scale"),
        "measured and calibration": ([*one, "--measured-step", "2.8", "--calibration", a100], "give one of them"),
        "blocks 1.5": ([*one, "--activation-checkpointing", "blocks:1.5"],
                       "invalid --activation-checkpointing 'blocks:1.5'"),
        "unknown mode": ([*one, "--activation-checkpointing", "sometimes"],
                         "invalid --activation-checkpointing 'sometimes'"),
        "table hole": ([*one, "--kernel-table", hole], "matmul.tflops[0][0][0] is None"),
        "table nan": ([*one, "--kernel-table", _table(tmp_path, "nan.json", lambda d: d["memory"].__setitem__(
            "fraction_of_peak", math.nan))], "kernel table"),
        "table without gpu": (["--tflops", "400", "--nodes", "1", *NETS, "--kernel-table", hole],
                              "--kernel-table"),
        "attention unknown": ([*one, "--attention-impl", "flash9"], "--attention-impl"),
    }


CASES = ["measured 0", "measured negative", "measured nan", "measured no gpu", "measured no configuration",
         "measured two networks", "measured too short", "calibration other gpu", "calibration without one",
         "measured and calibration", "blocks 1.5", "unknown mode", "table hole", "table nan", "table without gpu",
         "attention unknown"]


@pytest.mark.parametrize("case", CASES)
def test_bad_input_is_exit_2_with_one_line_before_any_output(case, tmp_path, capsys):
    argv, message = bad(tmp_path)[case]
    rc = main(["compose", *argv, "--results-dir", str(tmp_path / "results")])
    captured = capsys.readouterr()
    assert rc == 2 and captured.out == ""
    assert message in captured.err and len(captured.err.strip().splitlines()) == 1, captured.err


def test_an_mpt_config_with_the_triton_kernel_counts_llm_foundrys_call(tmp_path, capsys):
    config = tmp_path / "mpt.json"
    config.write_text(json.dumps({"model_type": "mpt", "d_model": 1536, "n_heads": 12, "n_layers": 24,
                                  "expansion_ratio": 4, "max_seq_len": 2048, "vocab_size": 50368}))
    argv = ["--model-config", str(config), "--nodes", "4", "--gpus-per-node", "8", "--gpu", "h100", "--micro-batch",
            "24", "--seq-len", "2048", *NETS]
    rc, out, err, rec = _compose([*argv, "--attention-impl", "triton"], tmp_path, capsys)
    assert rc == 0, err
    assert rec["summary"]["compute"]["memory_bytes_from"][0] == "blocks: counted gpt/bf16/llmfoundry-triton/bias/mha"
    rc, out, err, rec = _compose(argv, tmp_path, capsys, "sdpa.json")
    assert rec["summary"]["compute"]["memory_bytes_from"][0] == "blocks: counted gpt/bf16/sdpa/bias/mha"
