"""The compute probe: matmul shapes from a model, the step-weighted rate, and a real CPU run
whose record `compose --compute` reads."""

import json
from pathlib import Path

import pytest

from microbench.probes.compute import Config, achieved_tflops, matmul_shapes

TINY = str(Path(__file__).parent / "data" / "hf" / "tiny-llama.config.json")


def test_shapes_follow_the_model_and_experts_get_their_routed_tokens():
    dense = Config("d", hidden=4096, q_dim=4096, kv_dim=1024, ffn=14336, vocab=128256, layers=32, tokens=4096)
    shapes = {op: (m, n, k, w) for op, m, n, k, w in matmul_shapes(dense)}
    assert shapes["qkv"] == (4096, 6144, 4096, 1.0)
    assert shapes["mlp_gate_up"] == (4096, 28672, 4096, 1.0)
    assert shapes["head"][3] == pytest.approx(1 / 32)
    moe = Config("m", hidden=4096, q_dim=4096, kv_dim=1024, ffn=14336, vocab=32000, layers=32, experts=8, top_k=2,
                 tokens=4096)
    shapes = {op: (m, n, k, w) for op, m, n, k, w in matmul_shapes(moe)}
    assert shapes["mlp_down"] == (1024, 4096, 14336, 8.0)


def test_achieved_rate_is_total_flops_over_total_time():
    rows = [{"flops": 2e12, "per_block": 1.0, "tflops": 2.0},    # 1 s
            {"flops": 1e12, "per_block": 2.0, "tflops": 1.0}]    # 2 x 1 s
    assert achieved_tflops(rows) == pytest.approx(4e12 / 3 / 1e12)


def test_compute_record_feeds_compose(run_cli, tmp_path):
    done = run_cli("compute", "--model-config", TINY, "--tokens", "64", "--iters", "3", "--warmup", "1",
                   "--device", "cpu", "--json", "c.json")
    assert done.returncode == 0, done.stderr
    rec = json.loads((tmp_path / "c.json").read_text())
    assert rec["kind"] == "compute" and rec["status"] == "complete"
    assert {r["op"] for r in rec["rows"]} == {"qkv", "attn_out", "mlp_gate_up", "mlp_down", "head"}
    assert all(r["nwrong"] == 0 and r["tflops"] > 0 for r in rec["rows"])
    assert rec["implementation"]["device"] == "cpu" and rec["summary"]["achieved_tflops"] > 0
    composed = run_cli("compose", "--model-config", TINY, "--compute", "c.json", "--ranks", "2",
                       "--net", "lo=1GB/s", "--json", "p.json")
    assert composed.returncode == 0, composed.stderr
    pred = json.loads((tmp_path / "p.json").read_text())
    assert pred["config"]["compute"]["flops_per_rank"] == pytest.approx(rec["summary"]["achieved_tflops"] * 1e12)
    assert pred["config"]["compute"]["source"].startswith("measured: c.json")
    # a CPU predicting itself: gloo competes with compute for the cores, and reduces in float32
    assert pred["config"]["train"]["overlap"] == 0 and pred["config"]["train"]["reduce_dtype"] == "float32"
    wrong = run_cli("compose", "--compute", str(tmp_path / "p.json"), "--ranks", "2", "--net", "lo=1GB/s")
    assert wrong.returncode == 2
    assert wrong.stderr.strip().splitlines() == [
        f"microbench: --compute {str(tmp_path / 'p.json')!r} is a 'compose' record; expected one from "
        f"`microbench compute` (kind 'compute')"]
