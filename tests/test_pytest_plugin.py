"""The probe_benchmark fixture feeds a probe's case to pytest-benchmark, stats and all."""

import json
import subprocess
import sys

import pytest
from conftest import cli_env

TEST = '''
from microbench.accept.pytest_plugin import probe_benchmark  # noqa: F401
from microbench.core.probe import Case
from microbench.probes.memory import Config, MemoryProbe


def test_memcpy(probe_benchmark):
    info = probe_benchmark(MemoryProbe(Config(sizes=[4 << 20], gpu=False)), Case("memcpy_1t", 4 << 20), rounds=3)
    assert info["copy_gbps"] > 0
'''


@pytest.mark.slow
def test_probe_benchmark_saves_stats_and_bandwidth(tmp_path):
    (tmp_path / "test_mb.py").write_text(TEST)
    out = tmp_path / "bench.json"
    # Not an xdist worker's variables: pytest-benchmark would take the child for one and not time.
    env = {k: v for k, v in cli_env().items() if not k.startswith("PYTEST_XDIST_")}
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "test_mb.py",
                           f"--benchmark-json={out}"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout[-2000:]
    (bench,) = json.loads(out.read_text())["benchmarks"]
    assert bench["stats"]["rounds"] == 3
    extra = bench["extra_info"]
    assert extra["probe"] == "memory" and extra["op"] == "memcpy_1t" and extra["size_bytes"] == 4 << 20
    assert abs(extra["copy_gbps"] - (4 << 20) / bench["stats"]["median"] / 1e9) < 1e-9
