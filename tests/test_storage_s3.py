"""`microbench storage s3` and the embedded S3 server: real runs on a few MiB, every fault
the issue names (exit code, one line, nothing left behind), and the pure helpers."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from conftest import last_line
from microbench.core.errors import UsageError
from microbench.probes.storage.s3 import Config, part_plan, validate
from microbench.targets.s3client import public_url
from microbench.targets.s3server import EmbeddedS3, free_port

SMALL = ["--object-size", "3M", "--part-size", "1M", "--concurrency", "2", "--warmup", "0", "--iters", "2"]
NO_PROFILE = {"AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
              "AWS_EC2_METADATA_DISABLED": "true"}


def endpoint_env(server, **override):
    return {**NO_PROFILE, **server.env(), **override}


def objects_under(server, prefix="microbench-s3/"):
    page = server.client().list_objects_v2(Bucket=server.bucket, Prefix=prefix)
    return [o["Key"] for o in page.get("Contents", [])]


def assert_one_line_error(proc, code, words):
    assert proc.returncode == code, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    assert words in last_line(proc.stderr)


def test_part_plan_covers_the_object_once():
    plan = part_plan(5 << 20, 2 << 20)
    assert plan == [(0, 2 << 20), (2 << 20, 2 << 20), (4 << 20, 1 << 20)]
    assert part_plan(1 << 20, 4 << 20) == [(0, 1 << 20)]


def test_validate_limits():
    with pytest.raises(UsageError, match="10000"):
        validate(Config(object_size=1 << 30, part_size=1 << 10))
    with pytest.raises(UsageError, match="at most 5G"):
        validate(Config(object_size=1 << 30, part_size=6 << 30))
    validate(Config(object_size=64 << 20, part_size=128 << 20))


def test_public_url_drops_userinfo():
    assert public_url("http://user:pw@host:9000/x") == "http://host:9000/x"
    assert public_url("http://host:9000") == "http://host:9000"


def test_embedded_server_starts_serves_and_cleans_up():
    server = EmbeddedS3(bucket="fixture-test")
    with server:
        client = server.client()
        client.put_object(Bucket="fixture-test", Key="k", Body=b"abc")
        assert client.get_object(Bucket="fixture-test", Key="k")["Body"].read() == b"abc"
        proc, root = server._proc, server.root
        assert server.credentials.secret_access_key not in repr(server.credentials)
    assert proc.poll() is not None
    assert not root.exists()



def _resident_pages(path: Path) -> int:
    """Pages of `path` in the page cache (mincore over a read-only mapping)."""
    import ctypes
    import mmap

    size = path.stat().st_size
    page = mmap.PAGESIZE
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert addr not in (None, ctypes.c_void_p(-1).value), ctypes.get_errno()
        vec = ctypes.create_string_buffer(-(-size // page))
        try:
            assert libc.mincore(addr, size, vec) == 0, ctypes.get_errno()
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)
    return sum(b & 1 for b in vec.raw)


@pytest.mark.slow
def test_embedded_server_head_and_list_leave_dropped_pages_dropped(embedded_s3):
    """rclone hashed each object for its ETag on every HEAD and LIST, reading it back into the
    page cache; a checkpoint load that had just dropped its objects' pages then read memory."""
    client = embedded_s3.client()
    key = "etag-test/obj"
    client.put_object(Bucket=embedded_s3.bucket, Key=key, Body=os.urandom(8 << 20))
    path = embedded_s3.root / embedded_s3.bucket / key
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    before = _resident_pages(path)
    assert client.head_object(Bucket=embedded_s3.bucket, Key=key)["ContentLength"] == 8 << 20
    listed = client.list_objects_v2(Bucket=embedded_s3.bucket, Prefix="etag-test/")["Contents"]
    assert [o["Key"] for o in listed] == [key]
    assert _resident_pages(path) == before < 64  # 2048 pages when rclone hashed it
    client.delete_object(Bucket=embedded_s3.bucket, Key=key)

@pytest.mark.slow
def test_embedded_run_prints_table_and_writes_record(run_cli, tmp_path):
    proc = run_cli("storage", "s3", *SMALL, "--json", "s3.json")
    assert proc.returncode == 0, proc.stderr
    assert "embedded rclone serve s3" in proc.stdout
    header = next(line for line in proc.stdout.splitlines() if line.startswith("op "))
    assert "GB/s" in header and "ttfb p50 ms" in header
    record = json.loads((tmp_path / "s3.json").read_text())
    assert record["status"] == "complete"
    assert record["implementation"]["target"] == "embedded"
    assert record["implementation"]["credentials_source"] == "generated for the embedded server"
    rows = {r["op"]: r for r in record["rows"]}
    assert set(rows) == {"put", "get"}
    assert rows["put"]["upload"] == "multipart" and rows["put"]["nwrong"] == 0 and rows["get"]["nwrong"] == 0
    assert rows["get"]["requests"] == 3 and rows["get"]["ttfb_ms_p50"] > 0
    assert record["summary"]["get"]["requests"] == 6  # 2 iterations x 3 ranges, pooled
    assert not Path(record["implementation"]["backing_dir"]).exists()


@pytest.mark.slow
def test_credentials_never_reach_output_or_record(tmp_path, capsys, monkeypatch):
    from microbench import cli
    from microbench.targets.s3server import Credentials

    known = Credentials("MBKNOWNKEY123456", "Sup3rSecretValueNobodyMayPrint")
    monkeypatch.setattr(Credentials, "generate", classmethod(lambda cls: known))
    monkeypatch.chdir(tmp_path)
    assert cli.main(["storage", "s3", *SMALL, "--ops", "put", "--json", "r.json"]) == 0
    out = capsys.readouterr()
    text = out.out + out.err + (tmp_path / "r.json").read_text()
    assert known.secret_access_key not in text


@pytest.mark.slow
def test_endpoint_run_deletes_its_objects(run_cli, embedded_s3):
    proc = run_cli("storage", "s3", *SMALL, "--objects", "2", "--endpoint", embedded_s3.endpoint_url,
                   "--bucket", embedded_s3.bucket, "--json", "r.json", env=endpoint_env(embedded_s3))
    assert proc.returncode == 0, proc.stderr
    assert "deleted 3 object(s)" in proc.stdout   # the 2 objects and the single-stream case's one
    assert objects_under(embedded_s3) == []


@pytest.mark.slow
def test_keep_retains_objects_under_a_unique_prefix(run_cli, embedded_s3, tmp_path):
    proc = run_cli("storage", "s3", *SMALL, "--ops", "put", "--keep", "--object-size", "1M",
                   "--endpoint", embedded_s3.endpoint_url, "--bucket", embedded_s3.bucket, "--json", "r.json",
                   env=endpoint_env(embedded_s3))
    assert proc.returncode == 0, proc.stderr
    prefix = json.loads((tmp_path / "r.json").read_text())["config"]["probe"]["prefix"]
    keys = objects_under(embedded_s3, prefix)
    assert keys == [f"{prefix}obj-00000", f"{prefix}stream-00000"]   # the single-stream case's object too
    client = embedded_s3.client()
    for key in keys:
        client.delete_object(Bucket=embedded_s3.bucket, Key=key)


@pytest.mark.slow
def test_unreachable_endpoint_fails_fast(run_cli, tmp_path):
    port = free_port()  # nothing listens there
    proc = run_cli("storage", "s3", *SMALL, "--endpoint", f"http://127.0.0.1:{port}", "--bucket", "bkt",
                   "--timeout", "3", env={**NO_PROFILE, "AWS_ACCESS_KEY_ID": "abcdefgh",
                                          "AWS_SECRET_ACCESS_KEY": "abcdefgh"}, timeout=60)
    assert_one_line_error(proc, 1, "cannot reach S3 endpoint")
    assert not (tmp_path / "results").exists()


@pytest.mark.slow
def test_wrong_credentials(run_cli, embedded_s3, tmp_path):
    env = endpoint_env(embedded_s3, AWS_SECRET_ACCESS_KEY="not-the-right-secret")
    proc = run_cli("storage", "s3", *SMALL, "--endpoint", embedded_s3.endpoint_url,
                   "--bucket", embedded_s3.bucket, env=env)
    assert_one_line_error(proc, 1, "rejected the credentials (from env)")
    assert "not-the-right-secret" not in proc.stderr + proc.stdout
    assert not (tmp_path / "results").exists()
    assert objects_under(embedded_s3) == []


@pytest.mark.slow
def test_missing_bucket(cli, embedded_s3, tmp_path):
    proc = cli("storage", "s3", *SMALL, "--endpoint", embedded_s3.endpoint_url, "--bucket", "no-such-bucket",
                   env=endpoint_env(embedded_s3))
    assert_one_line_error(proc, 2, "bucket 'no-such-bucket' does not exist")
    assert not (tmp_path / "results").exists()


def test_unknown_profile(cli):
    proc = cli("storage", "s3", "--endpoint", "http://127.0.0.1:9", "--bucket", "bkt",
                   env={**NO_PROFILE, "AWS_PROFILE": "no-such-profile"})
    assert_one_line_error(proc, 2, "AWS profile 'no-such-profile' not found")


def test_no_credentials_for_an_endpoint(cli, tmp_path):
    env = {**NO_PROFILE, "AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": ""}
    proc = cli("storage", "s3", "--endpoint", "http://127.0.0.1:9", "--bucket", "bkt", env=env)
    assert_one_line_error(proc, 2, "no AWS credentials found")


@pytest.mark.parametrize("args, words", [
    (["--object-size", "0"], "invalid --object-size '0'"),
    (["--part-size", "3X"], "invalid --part-size '3X'"),
    (["--object-size", "1G", "--part-size", "1K"], "S3 allows 10000"),
    (["--part-size", "6G"], "at most 5G"),
    (["--concurrency", "0"], "invalid --concurrency '0'"),
    (["--objects", "none"], "invalid --objects 'none'"),
    (["--ops", "put,delete"], "invalid --ops 'delete'"),
    (["--endpoint", "ftp://host"], "invalid --endpoint 'ftp://host'"),
    (["--endpoint", "http://127.0.0.1:9"], "--endpoint needs --bucket"),
])
def test_bad_input(cli, tmp_path, args, words):
    proc = cli("storage", "s3", *args)
    assert_one_line_error(proc, 2, words)
    assert not (tmp_path / "results").exists()


@pytest.mark.slow
def test_get_check_counts_a_corrupted_chunk(embedded_s3):
    """The GET check compares every byte read with what was PUT: one flipped byte in one
    object's second part is one wrong chunk, and nothing else is."""
    from microbench.core.probe import Case
    from microbench.probes.storage.s3 import StorageS3Probe
    from microbench.targets.s3client import Target

    config = Config(object_size=3 << 20, part_size=1 << 20, concurrency=2, objects=2,
                    bucket=embedded_s3.bucket, prefix="corrupt-test/")
    probe = StorageS3Probe(config, Target.for_embedded(embedded_s3))
    get = Case("get", config.object_size)
    try:
        probe.prepare(get)  # PUTs the objects
        assert probe.check(get) == 0
        path = embedded_s3.root / embedded_s3.bucket / probe.keys()[1]
        with open(path, "r+b") as f:
            f.seek((1 << 20) + 12345)
            byte = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([byte[0] ^ 0xFF]))
        assert probe.check(get) == 1
    finally:
        probe.close()


@pytest.mark.slow
def test_the_probe_builds_one_client_for_all_its_threads(embedded_s3):
    """Built lazily by the first requests, each of the pool's threads found no client yet and
    built its own (eight clients for the first PUT instead of one)."""
    from microbench.core.probe import Case
    from microbench.probes.storage.s3 import StorageS3Probe
    from microbench.targets.s3client import Target

    built = []

    class CountingTarget(Target):
        def client(self, **kwargs):
            built.append(kwargs)
            return super().client(**kwargs)

    config = Config(object_size=12 << 20, part_size=5 << 20, concurrency=8, objects=4,
                    bucket=embedded_s3.bucket, prefix="one-client-test/")
    probe = StorageS3Probe(config, CountingTarget.for_embedded(embedded_s3))
    put = Case("put", config.object_size)
    try:
        probe.prepare(put)
        probe.run_once(put)
        assert probe.check(put) == 0
    finally:
        probe.close()
    assert len(built) == 1
