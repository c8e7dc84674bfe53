"""The compute probe at a training step's own shapes (--micro-batch, --seq-len): matmuls,
attention forward and backward and the memory-bound kernels, timed on this CPU, saying so."""

import json
from pathlib import Path

import pytest
from conftest import one_error_line

from microbench.compose.model import from_hf_config
from microbench.probes.compute.kernel_cases import kernel_cases

TINY = str(Path(__file__).parent / "data" / "hf" / "tiny-llama.config.json")


def test_kernel_cases_are_the_composers_kernels_weighted_by_the_mode():
    shape = from_hf_config(TINY)
    none = {c.op: c for c in kernel_cases(shape, 2, 64, "none")}
    ops = {c.op: c for c in kernel_cases(shape, 2, 64, "ops")}
    assert {"attention.fwd", "attention.bwd", "norm", "swiglu", "loss", "q.dgrad", "head.wgrad"} <= set(none)
    assert none["attention.bwd"].flops == 2.5 * none["attention.fwd"].flops
    assert (ops["k"].per_block, ops["q"].per_block) == (2.0, 1.0)     # every second mm recomputed
    assert ops["attention.fwd"].per_block == 1.0                      # attention saved
    full = {c.op: c for c in kernel_cases(shape, 2, 64, "full")}
    assert full["attention.fwd"].per_block == 2.0 and full["q"].per_block == 2.0


@pytest.mark.slow
def test_one_command_times_a_steps_kernels_on_the_cpu_and_says_so(run_cli, tmp_path):
    done = run_cli("compute", "--model-config", TINY, "--micro-batch", "1", "--seq-len", "64",
                   "--activation-checkpointing", "ops", "--iters", "2", "--warmup", "1", "--device", "auto",
                   "--json", "k.json")
    assert done.returncode == 0, done.stderr
    assert "timing the CPU" in done.stdout and "micro-batch 1 x 64 tokens" in done.stdout
    rec = json.loads((tmp_path / "k.json").read_text())
    classes = {r["op"]: r["cls"] for r in rec["rows"]}
    assert classes["attention.fwd"] == classes["attention.bwd"] == "attention"
    assert {op for op, c in classes.items() if c == "memory"} >= {"norm", "residual", "swiglu", "loss"}
    assert all(r["tflops"] > 0 for r in rec["rows"] if r["cls"] != "memory")
    assert all(r["gbps"] > 0 for r in rec["rows"] if r["cls"] == "memory")
    assert rec["summary"]["micro_batch"] == 1 and rec["summary"]["seq_len"] == 64
    assert rec["summary"]["activation_checkpointing"] == "ops"


def test_tokens_and_a_step_shape_together_are_refused(cli):
    done = cli("compute", "--model-config", TINY, "--tokens", "64", "--micro-batch", "1", "--seq-len", "64")
    assert done.returncode == 2
    assert "--tokens and --micro-batch/--seq-len" in one_error_line(done.stderr)


def test_a_bad_checkpointing_mode_is_refused_before_any_work(cli):
    done = cli("compute", "--model-config", TINY, "--micro-batch", "1", "--seq-len", "64",
                   "--activation-checkpointing", "blocks:1.5")
    assert done.returncode == 2
    assert "blocks:1.5" in one_error_line(done.stderr)
