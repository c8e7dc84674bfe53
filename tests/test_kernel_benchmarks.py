"""The two benchmark scripts of compute priced per kernel: benchmarks/kernel_tables.py writes a
table the composer loads (on this CPU, saying so), and benchmarks/published_fsdp.py composes every
published run in both modes and prints their statistics."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import cli_env

from microbench.compose import kernels

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def _run(script: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BENCH / script), *args], cwd=cwd, env=cli_env(None),
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_kernel_tables_on_the_cpu_writes_a_table_compose_loads(tmp_path):
    done = _run("kernel_tables.py", "--out", "t.json", "--iters", "1", "--warmup", "0", "--device", "cpu",
                cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "no CUDA device: measuring this CPU" in done.stdout
    table = kernels.load_table(tmp_path / "t.json")
    assert table.gpu == "cpu" and table.matmul(100, 100, 100) > 0
    assert all("benchmarks/kernel_tables.py on CPU" in s for s in table.sources.values())
    again = _run("kernel_tables.py", "--out", "t.json", "--device", "cpu", cwd=tmp_path)
    assert again.returncode == 2 and "exists" in again.stderr


@pytest.mark.slow
def test_published_fsdp_composes_every_row_in_both_modes(tmp_path):
    done = _run("published_fsdp.py", "--json", "out.json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["summary"]["described"]["rows"] == 32
    # a model with more than one row per GPU: every row but its calibration row is checked
    assert 0 < out["summary"]["calibrated"]["rows"] < 32
    assert "MAPE" in done.stdout and "calibrated" in done.stdout
    assert all(row["predicted_s"] > 0 for row in out["described"] + out["calibrated"])
