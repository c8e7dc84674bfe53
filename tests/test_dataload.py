"""`microbench dataload`: the dataset's contents and layout (unit), real DataLoader passes over a
directory and the embedded S3 server, and every bad input the issue names."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import cli_env, descendants, one_error_line, records, rows_written, tmpfs, wait_for
from microbench.probes.dataload import dataset as ds


# --------------------------------------------------------------------------- unit


def test_every_sample_checks_against_its_own_index_only():
    for low, high in ((16384, 16384), (1, 70000), (3, 3)):
        for index in (0, 7, 123457):
            size = ds.sample_size(index, low, high)
            data = bytearray(ds.sample_bytes(index, size, high))
            assert low <= size <= high and len(data) == size
            assert ds.wrong(index, data, high, size) == 0
            data[-1] ^= 1
            assert ds.wrong(index, data, high, size) == 1
            assert ds.wrong(index, data[:-1], high, size) == 1   # truncated
    # another sample's bytes of the same size are not this one
    assert ds.wrong(8, bytearray(ds.sample_bytes(7, 4096, 4096)), 4096, 4096) == 1


def _checks():
    """The Python twin, and the native check when the core is built (CI requires it built)."""
    from microbench.targets import native

    return [ds.check_sample] + ([native.module().check_sample] if native.available() else [])


@pytest.mark.parametrize("check", _checks(), ids=lambda c: "native" if "built-in" in repr(c) else "python")
def test_the_per_sample_check_refuses_every_wrong_sample(check):
    for low, high in ((16384, 16384), (1, 70000), (3, 3)):
        args = (low, high, ds.base_buffer(high), ds.SPAN, ds.STRIDE)
        for index in (0, 7, 123457):
            data = bytearray(ds.sample_bytes(index, ds.sample_size(index, low, high), high))
            name = ds.member_name(index)
            assert check(name, data, *args) == 0 and check(index, bytes(data), *args) == 0
            assert check(f"shards/x/{name}", data, *args) == 0            # the last path part names it
            assert check(ds.member_name(index + 1), data, *args) == 1     # read under another name
            assert check(index, data[:-1], *args) == 1                    # truncated
            assert check(index, data + b"x", *args) == 1                  # too long
            for bad_name in ("x.bin", ".bin", "12a4.bin", "-3.bin", "", "1" * 19 + ".bin"):
                assert check(bad_name, data, *args) == 1
            assert check(-1, data, *args) == 1
            flipped = bytearray(data)
            flipped[len(flipped) // 2] ^= 1
            assert check(index, flipped, *args) == 1


@pytest.mark.parametrize("layout, workers", [("shards", 2), ("files", 0)])
def test_a_corrupt_byte_on_disk_is_counted_by_the_loaders_pass(tmp_path, layout, workers):
    import torch  # noqa: F401

    from microbench.probes.dataload.loader import Source, loader, one_pass

    plan = ds.plan(layout, 200, 4096, 4096, 256 << 20, 4)
    paths = ds.write_local(plan, str(tmp_path))
    clean = one_pass(lambda: loader(Source(root=str(tmp_path)), plan, workers=workers, batch_size=16, prefetch_factor=2,
                                    decode_us=0, rank=0, ranks=1, pin_memory=False, epoch=1))
    assert (clean.samples, clean.wrong, clean.bytes) == (200, 0, 200 * 4096)
    with open(paths[1], "r+b") as handle:          # one byte inside a sample's data
        handle.seek(600 if layout == "shards" else 100)
        byte = handle.read(1)
        handle.seek(-1, 1)
        handle.write(bytes([byte[0] ^ 0xFF]))
    bad = one_pass(lambda: loader(Source(root=str(tmp_path)), plan, workers=workers, batch_size=16, prefetch_factor=2,
                                  decode_us=0, rank=0, ranks=1, pin_memory=False, epoch=2))
    assert (bad.samples, bad.wrong) == (200, 1)


def test_shards_hold_key_ext_members_in_order_and_small_datasets_get_smaller_shards():
    plan = ds.plan("shards", 1000, 4096, 4096, 256 << 20, min_shards=8)
    assert len(plan.shards) == 8 and plan.shards[0] == (0, 125) and plan.shards[-1][1] == 1000
    names = [name for name, _data in ds.tar_members(io.BytesIO(ds.shard_tar(plan, 1)))]
    assert names == [f"{i:08d}.bin" for i in range(125, 250)]
    big = ds.plan("shards", 100_000, 16384, 16384, 256 << 20, min_shards=8)
    assert len(big.shards) == 8   # 1.6 GB: more than 256M/shard would give 7
    assert ds.plan("files", 10, 1, 1, 1 << 20, 1).keys()[3] == "files/00000/00000003.bin"


# --------------------------------------------------------------------------- the real thing


def _mb(tmp_path, *args, timeout=300):
    return subprocess.run([sys.executable, "-m", "microbench", "dataload", *args], cwd=tmp_path, env=cli_env(),
                          capture_output=True, text=True, timeout=timeout)


def test_more_worker_processes_than_cpus_is_said_once_in_the_report(monkeypatch):
    import importlib

    dl_run = importlib.import_module("microbench.probes.dataload.run")   # the package's `run` is a function
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    assert dl_run._crowded([{"workers": 2, "ranks": 1}, {"workers": 0, "ranks": 1}]) is None
    note = dl_run._crowded([{"workers": 0, "ranks": 1}, {"workers": 4, "ranks": 1}])
    assert note.startswith("# up to 4 worker processes") and "on 2 CPUs" in note


@pytest.mark.slow
def test_workers_past_the_cpus_run_without_torchs_warning_and_the_report_says_so(tmp_path):
    workers = len(os.sched_getaffinity(0)) + 1
    done = _mb(tmp_path, "--path", str(tmp_path), "--samples", "200", "--workers", str(workers))
    assert done.returncode == 0, done.stderr
    assert "UserWarning" not in done.stderr and "worker processes" not in done.stderr, done.stderr
    assert f"# up to {workers} worker processes (workers x ranks) on {workers - 1} CPUs" in done.stdout


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["shards", "files"])
def test_a_pass_per_worker_count_reads_and_checks_every_sample(tmp_path, layout):
    done = _mb(tmp_path, "--path", str(tmp_path), "--layout", layout, "--samples", "400", "--sample-size", "2K-6K",
               "--workers", "0,2", "--batch-size", "16")
    assert done.returncode == 0, done.stderr
    record = records(tmp_path)[0]
    assert record["status"] == "complete"
    rows = record["rows"]
    assert [r["workers"] for r in rows] == [0, 2]
    for row in rows:
        assert row["op"] == layout and row["nwrong"] == 0 and row["samples"] == 400
        assert row["samples_per_s"] > 0 and row["read_gbps"] > 0 and row["first_batch_s"] > 0
        assert row["batch_wait_us_p99"] >= row["batch_wait_us_p50"] > 0
    assert "posix_fadvise" in record["implementation"]["cache_drop"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("microbench-dataload-")]   # removed


@pytest.mark.slow
def test_two_ranks_each_read_their_share_and_the_slowest_sets_the_rate(tmp_path):
    done = _mb(tmp_path, "--path", str(tmp_path), "--samples", "300", "--sample-size", "4K", "--workers", "1",
               "--nproc", "2")
    assert done.returncode == 0, done.stderr
    row = records(tmp_path)[0]["rows"][0]
    assert row["ranks"] == 2 and row["nwrong"] == 0 and len(row["per_rank_time_us_p50"]) == 2
    # both ranks' samples count, over the slower rank's time
    assert row["samples_per_s"] == pytest.approx(300 / (row["time_us"]["p50"] / 1e6), rel=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("layout,gets", [("shards", 8), ("files", 120)])
def test_s3_reads_over_the_s3_api_and_counts_requests(tmp_path, layout, gets):
    pytest.importorskip("botocore")
    done = _mb(tmp_path, "--target", "s3://microbench/dl", "--layout", layout, "--samples", "120",
               "--sample-size", "4K", "--workers", "2")
    if "rclone is not installed" in done.stdout + done.stderr:
        pytest.skip("rclone missing")
    assert done.returncode == 0, done.stderr
    row = records(tmp_path)[0]["rows"][0]
    assert row["nwrong"] == 0 and row["s3_requests"] == gets and "S3 GETs" in done.stdout


@pytest.mark.slow
def test_a_dataset_on_tmpfs_is_flagged_memory(tmp_path):
    with tmpfs(tmp_path / "mem", "size=64m") as mem:
        done = _mb(tmp_path, "--path", str(mem), "--samples", "100", "--sample-size", "4K", "--workers", "0")
    assert done.returncode == 0, done.stderr
    assert records(tmp_path)[0]["rows"][0]["served_from_memory"] is True
    assert "(memory!)" in done.stdout


# --------------------------------------------------------------------------- failures


@pytest.mark.slow
@pytest.mark.parametrize("args,words", [
    (["--workers", "-1"], "--workers '-1'"),
    (["--batch-size", "0"], "--batch-size '0'"),
    (["--layout", "lmdb"], "--layout 'lmdb'"),
    (["--sample-size", "2M", "--shard-size", "1M"], "larger than a shard"),
    (["--samples", "100000000", "--sample-size", "1M"], "not enough free space"),
    (["--sample-size", "9K-4K"], "below its start"),
])
def test_bad_input_is_refused_before_any_work(tmp_path, args, words):
    done = _mb(tmp_path, "--path", str(tmp_path), *args)
    assert done.returncode == 2
    assert words in one_error_line(done.stderr)
    assert not (tmp_path / "results").exists() and not list(tmp_path.glob("microbench-dataload-*"))


def _slow_run(tmp_path):
    return subprocess.Popen([sys.executable, "-m", "microbench", "dataload", "--path", str(tmp_path), "--samples",
                             "3000", "--sample-size", "1K", "--workers", "0,2", "--decode-us", "2000"],
                            cwd=tmp_path, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _loader_workers(pid: int) -> list[int]:
    return [p for p in descendants(pid) if os.path.exists(f"/proc/{p}")]


@pytest.mark.slow
def test_a_worker_that_dies_fails_the_run_naming_it_and_keeps_finished_cases(tmp_path):
    proc = _slow_run(tmp_path)
    wait_for(rows_written(tmp_path, 1), proc, "the workers=0 case")
    wait_for(lambda: _loader_workers(proc.pid), proc, "a DataLoader worker")
    os.kill(_loader_workers(proc.pid)[0], signal.SIGKILL)
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1
    line = one_error_line(err)
    assert "DataLoader worker" in line and "died" in line and "workers=2" in line and "partial" in line
    record = records(tmp_path)[0]
    assert record["status"] == "partial" and [r["workers"] for r in record["rows"]] == [0]


@pytest.mark.slow
def test_ctrl_c_leaves_a_partial_record_and_one_line(tmp_path):
    proc = _slow_run(tmp_path)
    wait_for(rows_written(tmp_path, 1), proc, "the workers=0 case")
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1
    assert "interrupted" in one_error_line(err)
    record = records(tmp_path)[0]
    assert record["status"] == "partial" and len(record["rows"]) == 1
    assert not list(tmp_path.glob("microbench-dataload-*"))   # the dataset is still removed

