"""Golden-input tests of the bucket-mount tier (compose/checkpoint/mount.py): values worked out by hand."""

import json

import pytest

from microbench.compose.checkpoint.mount import MountTier, from_record, parse_options, plan
from microbench.compose.report import format_time
from microbench.core.errors import UsageError

GB = 1e9


def test_cached_mount_that_drains_in_time():
    # 100 GB at 10 GB/s into the cache: 10 s blocked; 5 s write-back; 100 GB at 1 GB/s: 100 s upload.
    tier = MountTier("bucket", 10.0, None, True, 1.0, 5.0)
    p = plan(tier, 100 * GB, 1800.0, 0.05)
    assert p.blocked_s == pytest.approx(10.0) and p.durable_s == pytest.approx(115.0)
    assert p.drains_in_time and p.cache_growth_bytes_per_interval == 0.0
    assert p.min_interval_s == pytest.approx(115.0)
    assert p.overhead == pytest.approx(10 / 1800)
    # Drain window 1800 - 10 - 5 = 1785 s: 100 GB / 1785 s.
    assert p.least_bucket_gbps == pytest.approx(100 / 1785)


def test_cached_mount_whose_drain_falls_behind_grows_its_cache():
    # 100 GB every 60 s with a 1 GB/s drain: 60 GB leave per interval, 40 GB stay behind.
    p = plan(MountTier("slow", 10.0, None, True, 1.0, 5.0), 100 * GB, 60.0, 0.2)
    assert not p.drains_in_time
    assert p.cache_growth_bytes_per_interval == pytest.approx(40 * GB)
    assert p.least_bucket_gbps == pytest.approx(100 / (60 - 10 - 5))


def test_cached_mount_whose_cache_disk_alone_exceeds_the_overhead_has_no_bucket_answer():
    p = plan(MountTier("disk", 1.0, None, True, 5.0), 100 * GB, 1000.0, 0.05)   # 100 s blocked = 10%
    assert p.least_bucket_gbps is None and "cache disk" in p.least_bucket_note


def test_direct_mount_is_durable_when_it_returns():
    p = plan(MountTier("direct", 0.1, 0.3, False, 0.1), 12e9, 1800.0, 0.05)
    assert p.blocked_s == pytest.approx(120.0) and p.durable_s == p.blocked_s and p.drains_in_time
    assert p.least_bucket_gbps == pytest.approx(12 / (0.05 * 1800))


def test_tier_text_parses_and_refuses_with_examples():
    t = parse_options("b=6:12,cached,drain=1.5,delay=5s", "b", 6.0, 12.0, "cached,drain=1.5,delay=5s")
    assert (t.cached, t.drain_gbps, t.write_back_s) == (True, 1.5, 5.0)
    assert parse_options("d=0.1,direct", "d", 0.1, None, "direct").drain_gbps == 0.1
    for bad, words in [("cached", "needs drain="), ("drain=1", "cached or direct"), ("cached,drain=x", "drain"),
                       ("cached,drain=1,speed=3", "unknown part"), ("direct,drain=1", "drain= is for cached")]:
        with pytest.raises(UsageError, match=words):
            parse_options(f"b=6,{bad}", "b", 6.0, None, bad)


def test_tier_from_a_storage_mount_record():
    # 1 GB blocked 0.5 s, durable 3.5 s with a 1 s write-back: the upload took 2 s, 0.5 GB/s.
    record = {"kind": "storage_mount", "config": {"write_back_s": 1.0}, "rows": [
        {"op": "write", "mode": "direct", "size_bytes": 1e9, "blocked_time_us": 4e6, "durable_time_us": 4e6},
        {"op": "write", "mode": "cached", "size_bytes": 1e9, "blocked_time_us": 0.5e6, "durable_time_us": 3.5e6}]}
    t = from_record(record, "m", "x.json")
    assert t.cached and t.write_gbps == pytest.approx(2.0) and t.drain_gbps == pytest.approx(0.5)
    assert t.write_back_s == 1.0
    assert from_record({"kind": "storage_posix", "rows": []}, "p", "y.json") is None


def test_compose_command_prints_the_mount_table(cli):
    res = cli("compose", "--model", "llama-3.1-8b", "--gpu", "h100", "--net", "ib=40GB/s", "--ranks", "16", "--tier", "bucket=10:20,cached,drain=1,delay=5s",
                  "--tier", "direct=0.1:0.3,direct", "--ckpt-interval", "30min")
    assert res.returncode == 0, res.stderr
    assert "bucket mounts" in res.stdout and "least bucket" in res.stdout and "direct" in res.stdout


def test_the_mount_table_takes_the_jobs_own_checkpoint_period(cli, tmp_path):
    """With --steps and --ckpt-every the mount table's interval is the job's: its steps of the
    recommended configuration and then the save, not --ckpt-interval's 30 min."""
    base = ["compose", "--model", "gemma-3-12b", "--nodes", "2", "--gpus-per-node", "8", "--gpu", "h100",
            "--net", "ib=40GB/s", "--tier", "bucket=10:20,cached,drain=1,delay=5s"]
    job = cli(*base, "--steps", "200", "--ckpt-every", "5", "--json", "j.json")
    assert job.returncode == 0, job.stderr
    table = job.stdout.split("## bucket mounts:", 1)[1].split("\n\n", 1)[0]
    assert table.startswith(" a checkpoint every 5 steps (--ckpt-every): ") and "30.0 min" not in table
    rec = json.loads((tmp_path / "j.json").read_text())
    step_s = next(r["step_s"] for r in rec["rows"] if r["op"] == "step")
    blocked_s = rec["summary"]["checkpoint"]["training_checkpoint_bytes"] / 10e9
    row = next(line for line in table.splitlines() if line.startswith("bucket "))
    assert row.split()[2:4] == format_time(5 * step_s + blocked_s).split()
    plain = cli(*base, "--ckpt-interval", "30min")
    assert "## bucket mounts: a checkpoint every 30.0 min, at most 5% blocked" in plain.stdout
