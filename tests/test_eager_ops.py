"""benchmarks/eager_ops.py, the count behind data/eager_ops.json: rerun whole it reproduces the
shipped file, and one direct count at a real hidden size and two token counts equals what the
composer evaluates from the shipped coefficients (bytes linear in tokens, matmuls at their shapes)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from conftest import cli_env

from microbench.compose.kernels import eager
from microbench.compose.model.gpt import mpt
from microbench.compose.model.shapes import ModelShape

pytest.importorskip("torch")
SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "eager_ops.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], env=cli_env(None), capture_output=True, text=True,
                          timeout=900)


@pytest.mark.slow
def test_a_fresh_count_reproduces_the_shipped_file():
    done = _run("--check")
    assert done.returncode == 0, done.stderr
    assert "the same as a fresh count" in done.stdout


MPT760 = mpt("MPT-760m", 1536, 12, 24, 50368)
LLAMA_1B = ModelShape("llama-3.2-1b shapes", hidden=2048, layers=16, heads=32, kv_heads=8, head_dim=64, ffn=8192,
                      vocab=128256)


@pytest.mark.slow
@pytest.mark.parametrize("model, signature, precision, call, batch, seq", [
    (MPT760, "gpt/amp_bf16/llmfoundry-triton/bias/mha", "amp_bf16", "llmfoundry-triton", 2, 8),
    (MPT760, "gpt/amp_bf16/llmfoundry-triton/bias/mha", "amp_bf16", "llmfoundry-triton", 2, 16),
    (MPT760, "gpt/bf16/llmfoundry-flash/bias/mha", "bf16", "llmfoundry-flash", 3, 8),
    (LLAMA_1B, "llama/bf16/sdpa/nobias/gqa", "bf16", "sdpa", 2, 8)])
def test_a_direct_count_at_a_real_width_is_what_compose_evaluates(model, signature, precision, call, batch, seq):
    dims = ",".join(f"{k}={v}" for k, v in eager.dims(model, batch, seq).items() if k not in ("V", "P"))
    done = _run("--direct", "block", signature, "--dims", dims)
    assert done.returncode == 0, done.stderr
    direct = json.loads(done.stdout)
    counted = eager.counted_block(model, batch, seq, precision, call)
    assert counted.signature == signature
    for pass_, got in direct.items():
        want: dict[str, float] = {}
        for k in counted.memory(pass_):
            want[k.name] = want.get(k.name, 0.0) + k.bytes
        assert {op.split(".", 1)[1]: b for op, b in got["memory"].items()} == want, pass_
        assert Counter(map(tuple, got["matmul"])) == Counter(counted.matmuls(pass_)), pass_
