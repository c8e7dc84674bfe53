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


@pytest.mark.slow
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


def test_backward_adds_each_projections_two_matmuls_with_their_own_shapes():
    cfg = Config("d", hidden=256, q_dim=256, kv_dim=128, ffn=704, vocab=4096, layers=4, tokens=512, backward=True)
    shapes = {op: (m, n, k, w) for op, m, n, k, w in matmul_shapes(cfg)}
    assert shapes["mlp_down"] == (512, 256, 704, 1.0)
    # dy (m x n) @ w^T (n x k) and x^T (k x m) @ dy (m x n): same FLOPs, the tokens inside for the weight's
    assert shapes["mlp_down.dgrad"] == (512, 704, 256, 1.0)
    assert shapes["mlp_down.wgrad"] == (704, 256, 512, 1.0)
    assert shapes["head.wgrad"] == (256, 4096, 512, 0.25)
    assert len(shapes) == 15
    forward = Config(**{**cfg.__dict__, "backward": False})
    assert [s[0] for s in matmul_shapes(forward)] == ["qkv", "attn_out", "mlp_gate_up", "mlp_down", "head"]


def test_the_step_replay_runs_every_kernel_of_a_step():
    import torch

    from microbench.probes.compute.replay import StepReplay

    cfg = Config("t", hidden=64, q_dim=64, kv_dim=32, ffn=176, vocab=512, layers=2, tokens=32, backward=True)
    replay = StepReplay(cfg, heads=4, kv_heads=2)
    calls = []
    real = torch.matmul

    def counting(a, b):
        calls.append((tuple(a.shape), tuple(b.shape)))
        return real(a, b)

    torch.matmul = counting
    try:
        elapsed = replay.time_once()
    finally:
        torch.matmul = real
    assert elapsed > 0
    # per layer 4 projections x (forward + 2 backward), and the head's 3
    assert len(calls) == 2 * 4 * 3 + 3
    assert ((32, 64), (64, 128)) in calls and ((176, 32), (32, 64)) in calls   # qkv fwd, down's weight grad
    assert all(q.grad is None for q, *_ in replay.attn)   # attention's backward ran on fresh leaves
