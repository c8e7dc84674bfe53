"""`microbench nccl` end to end with real gloo ranks on this machine."""

import csv
import json

import pytest
from conftest import records

from microbench.probes.nccl import OPS
from microbench.results import SCHEMA_VERSION
from microbench.targets import native

pytestmark = pytest.mark.slow

DEFAULT_IMPL = "native" if native.available() else "python"


def only_record(directory):
    files = sorted(directory.glob("*.json"))
    assert len(files) == 1, files
    return json.loads(files[0].read_text())


def test_default_ops_print_the_table_and_write_a_record(run_cli, tmp_path):
    res = run_cli("nccl", "--sizes", "1M-4M", "--nproc", "2", "--csv", "rows.csv", "--iters", "5", "--warmup", "2")
    assert res.returncode == 0, res.stderr
    assert res.stderr == ""  # no progress off a terminal, and no gloo/torch warnings
    out = res.stdout
    for op in ("reduce_scatter", "all_gather", "all_reduce"):
        assert f"# {op}\n" in out
    assert "out-of-place" in out and "busbw #wrong" in out
    # Under each op: a fit and its average busbw, or, when the times do not follow latency +
    # size/bandwidth (which three sizes on a shared 2-core VM often do not), "not fitted" with why
    # and the best measured busbw: never neither.
    blocks = {b.split("\n", 2)[1 if b.startswith("# microbench") else 0]: b for b in out.split("\n\n")}
    for op in ("reduce_scatter", "all_gather", "all_reduce"):
        block = blocks[f"# {op}"]
        assert "# fit (" in block
        assert ("# avg busbw" in block) != ("not fitted" in block and "# best measured busbw" in block)
    assert "2 ranks, backend gloo on cpu, transport tcp, dtype float32" in out
    for size in (1 << 20, 2 << 20, 4 << 20):
        assert f"{size:>12}" in out

    rec = only_record(tmp_path / "results")
    assert rec["schema_version"] == SCHEMA_VERSION and rec["status"] == "complete" and rec["kind"] == "nccl"
    assert rec["argv"][-10:] == ["nccl", "--sizes", "1M-4M", "--nproc", "2", "--csv", "rows.csv", "--iters", "5",
                                  "--warmup", "2"][-10:]
    assert rec["config"]["probe"]["sizes"] == [1 << 20, 2 << 20, 4 << 20]
    assert rec["config"]["probe"]["ops"] == ["reduce_scatter", "all_gather", "all_reduce"]
    assert rec["config"]["world"] == {"size": 2, "backend": "gloo", "launcher": "local"}
    assert rec["environment"]["hostname"] and rec["environment"]["torch"]
    impl = rec["implementation"]
    assert impl["name"] == DEFAULT_IMPL and impl["transport_used"] == "tcp" and impl["backend"] == "gloo"
    rows = rec["rows"]
    assert len(rows) == 3 * (2 + 2 + 1)
    for row in rows:
        t = row["time_us"]
        assert 0 < t["p50"] <= t["p95"] <= t["max"]
        assert row["nwrong"] == 0 and row["iters"] >= 3 and len(row["per_rank_time_us_p50"]) == 2
        assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"] * OPS[row["op"]].factor(2))
        assert row["algbw_gbps"] == pytest.approx(row["size_bytes"] / (t["p50"] * 1e-6) / 1e9)
        assert row["dtype"] == "float32" and row["count"] == row["size_bytes"] // 4
    assert set(rec["summary"]["fits"]) == {"reduce_scatter", "all_gather", "all_reduce"}

    with open(tmp_path / "rows.csv") as handle:
        flat = list(csv.DictReader(handle))
    assert len(flat) == len(rows)
    assert {"op", "size_bytes", "placement", "time_us.p50", "time_us.p95", "time_us.max", "busbw_gbps",
            "nwrong"} <= set(flat[0])


def test_all_five_ops_on_the_python_fallback(run_cli, tmp_path):
    res = run_cli("nccl", "--sizes", "64K,256K", "--nproc", "2", "--ops", "broadcast,all_to_all,all_reduce,"
                  "reduce_scatter,all_gather", "--iters", "3", "--warmup", "1", "--dtype", "bfloat16",
                  "--json", "out.json", env={"MICROBENCH_NO_NATIVE": "1"})
    assert res.returncode == 0, res.stderr
    assert res.stderr == ""
    rec = json.loads((tmp_path / "out.json").read_text())
    assert rec["implementation"]["name"] == "python"
    assert rec["implementation"]["fallback_reason"] == "MICROBENCH_NO_NATIVE is set"
    assert rec["environment"]["implementation"]["name"] == "python"
    seen = {(r["op"], r["placement"]) for r in rec["rows"]}
    assert seen == {(op, p) for op in OPS for p in OPS[op].placements}
    assert all(r["nwrong"] == 0 and r["dtype"] == "bfloat16" for r in rec["rows"])
    broadcast = [r for r in rec["rows"] if r["op"] == "broadcast"]
    assert all(r["root"] == 0 and r["busbw_gbps"] == pytest.approx(r["algbw_gbps"]) for r in broadcast)
    assert "# broadcast" in res.stdout and "# all_to_all" in res.stdout


def test_env_text_and_json(run_cli):
    text = run_cli("env", env={"MICROBENCH_NO_NATIVE": "1"})
    assert text.returncode == 0 and text.stderr == ""
    for key in ("host", "cpu", "memory", "kernel", "python", "torch", "gloo", "nccl", "cuda", "implementation",
                "nic lo"):
        assert any(line.startswith(key) for line in text.stdout.splitlines()), key
    assert "python (MICROBENCH_NO_NATIVE is set)" in text.stdout
    data = json.loads(run_cli("env", "--json").stdout)
    assert data["implementation"]["name"] == DEFAULT_IMPL
    assert data["cpu_count"] >= 1 and data["memory"]["total_bytes"] > 0 and data["gloo"] is True
    assert any(nic["name"] == "lo" and nic["link"] == "loopback" for nic in data["nics"])


@pytest.mark.parametrize("no_native", [False, True])
def test_memory_both_implementations(run_cli, tmp_path, no_native):
    if not no_native and not native.available():
        pytest.skip("native module not built here (cmake -S . -B build -G Ninja && cmake --build build)")
    res = run_cli("memory", "--sizes", "4M", "--iters", "3", "--warmup", "1", "--json", "mem.json",
                  env={"MICROBENCH_NO_NATIVE": "1" if no_native else "0"})
    assert res.returncode == 0, res.stderr
    assert res.stderr == ""
    rec = json.loads((tmp_path / "mem.json").read_text())
    impl = rec["implementation"]
    assert impl["name"] == ("python" if no_native else "native")
    assert impl["engine"] == ("numpy copy (python fallback)" if no_native else "memcpy (native)")
    assert {r["op"] for r in rec["rows"]} >= {"memcpy_1t", "memcpy_all"}
    assert all(r["copy_gbps"] > 0 for r in rec["rows"])
    assert "copy GB/s" in res.stdout and f"implementation {impl['name']}" in res.stdout
    assert "GPU copies skipped: no CUDA device" in res.stdout


@pytest.mark.slow
def test_nccl_with_one_rank_measures_algbw_and_zero_busbw(run_cli, tmp_path):
    ops = "reduce_scatter,all_gather,all_reduce,broadcast,all_to_all"
    proc = run_cli("nccl", "--nproc", "1", "--sizes", "1M-2M", "--ops", ops, "--warmup", "1", "--iters", "3",
                   "--timeout", "20", timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert "1 ranks" in proc.stdout
    (record,) = records(tmp_path)
    assert record["status"] == "complete" and {r["op"] for r in record["rows"]} == set(ops.split(","))
    for row in record["rows"]:
        assert row["algbw_gbps"] > 0 and row["nwrong"] == 0
        # nccl-tests: (n-1)/n factors are 0 for one rank; broadcast's factor is 1.
        assert row["busbw_gbps"] == (row["algbw_gbps"] if row["op"] == "broadcast" else 0.0)
