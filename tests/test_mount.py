"""`microbench mount up|down|status` and the probes on a bucket mount: real rclone mounts of the
embedded S3 server, each under a temporary state directory removed afterwards (also on failure)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import one_error_line
from microbench.targets.mount import system as mount_sys

# One mount test at a time (group "mounts"), beside the lab tests: no verdict here rests on a lab's speeds.
pytestmark = [pytest.mark.root, pytest.mark.xdist_group("mounts"), pytest.mark.skipif(mount_sys.fuse_unavailable_reason() is not None,
                                                    reason=str(mount_sys.fuse_unavailable_reason()))]


@pytest.fixture
def state(tmp_path, monkeypatch):
    """A private state root for this test; whatever is left mounted or running is removed."""
    root = tmp_path / "state"
    monkeypatch.setenv(mount_sys.STATE_ENV, str(root))
    yield root
    from microbench.targets import mount as mountmod

    # Only this test's mounts: names() also lists every microbench mount on the machine, and a
    # teardown that downed those stopped the daemon under a `verify job` running beside the tests.
    ours = {p.name[len("mount-"):] for p in root.glob("mount-*")}
    ours |= {info["source"][len(mountmod.DEVNAME_PREFIX):].split(":", 1)[0] for info in mount_sys.mounts()
             if info["mount_point"].startswith(f"{tmp_path}/") and info["source"].startswith(mountmod.DEVNAME_PREFIX)}
    for name in sorted(ours):
        mountmod.down(name)
    assert not _ours_mounted(root) and not _ours_running(root)


def _ours_mounted(root: Path) -> list[str]:
    text = Path("/proc/self/mountinfo").read_text()
    return [line for line in text.splitlines() if str(root) in line]


def _ours_running(root: Path) -> list[str]:
    """Live (not zombie) processes whose command line names the state root: this sandbox's
    pid 1 does not reap orphans, so a stopped rclone can linger as a zombie."""
    out = subprocess.run(["ps", "-eo", "pid,stat,args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if str(root) in line and " Z" not in line and "ps -eo" not in line]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
def test_up_status_down_leaves_no_mount_process_or_cache(state, run_cli, tmp_path):
    up = run_cli("mount", "up", "--name", "m", "--mode", "cached", "--write-back", "1s")
    assert up.returncode == 0, up.stderr
    path = up.stdout.strip().splitlines()[-1]
    home = state / "mount-m"
    facts = json.loads((home / "state.json").read_text())
    assert (home / "state.json").stat().st_mode & 0o777 == 0o600
    # The generated secret is in the private state file only: not in output, not on any command line.
    secret = facts["secret"]
    assert secret and secret not in up.stdout + up.stderr
    assert all(secret not in line for line in subprocess.run(["ps", "-eo", "args"], capture_output=True,
                                                             text=True).stdout.splitlines())
    assert any(path in line and "fuse.rclone" in line for line in _ours_mounted(state))
    Path(path, "f.bin").write_bytes(b"x" * (1 << 20))
    status = run_cli("mount", "status", "--json")
    rows = json.loads(status.stdout)
    assert rows[0]["state"] == "up" and rows[0]["mode"] == "cached" and "secret" not in status.stdout
    assert os.path.isdir(facts["cache_dir"])
    down = run_cli("mount", "down", "--name", "m")
    assert down.returncode == 0, down.stderr
    assert not _ours_mounted(state) and not _ours_running(state)
    assert not os.path.exists(facts["cache_dir"]) and not home.exists()


@pytest.mark.parametrize("args, words", [
    (("--mode", "fast"), "invalid --mode 'fast'"),
    (("--name", "Bad Name"), "invalid --name"),
])
def test_bad_flags_exit_2(state, cli, args, words):
    res = cli("mount", "up", *args)
    assert res.returncode == 2 and words in one_error_line(res.stderr)
    assert not _ours_mounted(state)


@pytest.mark.slow
def test_mount_point_not_empty_or_mounted_or_cache_on_mount_exit_2(state, run_cli, tmp_path):
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep").write_text("x")
    res = run_cli("mount", "up", "--path", str(full))
    assert res.returncode == 2 and "is not empty" in one_error_line(res.stderr)
    point = tmp_path / "mnt"
    res = run_cli("mount", "up", "--path", str(point), "--cache-dir", str(point / "cache"))
    assert res.returncode == 2 and "on the mount" in one_error_line(res.stderr)
    assert run_cli("mount", "up", "--name", "a", "--path", str(point), "--mode", "direct").returncode == 0
    res = run_cli("mount", "up", "--name", "b", "--path", str(point))
    assert res.returncode == 2 and "already mounted" in one_error_line(res.stderr)
    res = run_cli("mount", "up", "--name", "c", "--mode", "cached", "--cache-dir", str(point))
    assert res.returncode == 2 and "--cache-dir" in one_error_line(res.stderr)
    res = run_cli("mount", "up", "--name", "a", "--mode", "direct")
    assert res.returncode == 2 and "already up" in one_error_line(res.stderr)


@pytest.mark.slow
def test_unreachable_endpoint_and_wrong_credentials_exit_1_nothing_mounted(state, run_cli, tmp_path):
    aws = {"AWS_ACCESS_KEY_ID": "AKIAWRONG000", "AWS_SECRET_ACCESS_KEY": "wrongwrongwrong", "AWS_DEFAULT_REGION": "us-east-1"}
    res = run_cli("mount", "up", "--endpoint", f"http://127.0.0.1:{_free_port()}", "--bucket", "microbench", env=aws)
    assert res.returncode == 1 and "cannot reach" in one_error_line(res.stderr)
    from microbench.targets.s3server import EmbeddedS3

    with EmbeddedS3(bucket="microbench") as server:
        res = run_cli("mount", "up", "--endpoint", server.endpoint_url, "--bucket", "microbench", env=aws)
    assert res.returncode == 1 and "credentials" in one_error_line(res.stderr)
    assert not _ours_mounted(state) and not list(state.glob("mount-*"))


def test_no_fuse_mount_up_exit_1_and_probe_skips(state, monkeypatch, capsys, tmp_path):
    from microbench import cli

    # In-process: the skipped record goes to ./results, which must be the test's, not the checkout's.
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(mount_sys, "fuse_unavailable_reason", lambda: "FUSE is not available: no /dev/fuse (test)")
    assert cli.main(["mount", "up", "--name", "m"]) == 1
    assert capsys.readouterr().err.strip() == "microbench: cannot mount: FUSE is not available: no /dev/fuse (test)"
    assert cli.main(["storage", "mount", "--size", "1M"]) == 0
    assert "no /dev/fuse (test)" in capsys.readouterr().err
    (skipped,) = (tmp_path / "results").glob("storage_mount-*.json")
    assert json.loads(skipped.read_text())["status"] == "skipped"


@pytest.mark.slow
def test_crash_leftovers_found_and_removed(state, run_cli):
    assert run_cli("mount", "up", "--name", "m", "--mode", "direct").returncode == 0
    (state / "mount-m" / "state.json").unlink()   # a crash before the state was written
    assert any("microbench-m:" in line for line in Path("/proc/self/mountinfo").read_text().splitlines())
    res = run_cli("mount", "up", "--name", "m", "--mode", "direct")
    assert res.returncode == 0 and "removed leftovers" in res.stdout
    assert run_cli("mount", "down", "--name", "m").returncode == 0
    assert not _ours_mounted(state) and not _ours_running(state)


@pytest.mark.slow
def test_storage_posix_on_cached_mount_records_the_mount(state, run_cli, tmp_path):
    up = run_cli("mount", "up", "--name", "m", "--mode", "cached", "--write-back", "1s")
    path = up.stdout.strip().splitlines()[-1]
    res = run_cli("storage", "posix", "--path", path, "--size", "8M", "--bs", "1M", "--iters", "1", "--warmup", "0",
                  "--json", str(tmp_path / "p.json"))
    assert res.returncode == 0, res.stderr
    record = json.loads((tmp_path / "p.json").read_text())
    impl = record["implementation"]
    assert impl["on_mount"] is True and impl["mount_mode"] == "cached" and impl["mount_name"] == "m"
    # A FUSE mount is no block device: the expectation says what it is, here and on stdout.
    why = record["summary"]["expected"]["unknown_why"]
    assert "(fuse.rclone) is a FUSE mount: rclone decides where its bytes go" in why, why
    assert "block device" not in res.stdout and "is a FUSE mount" in res.stdout
    assert impl["rclone_version"].startswith("v") and "embedded S3" in impl["backing_store"]
    assert "secret" not in json.dumps(impl) and json.loads((state / "mount-m" / "state.json").read_text())["secret"] \
        not in (tmp_path / "p.json").read_text()


@pytest.mark.slow
def test_checkpoint_on_cached_mount_reports_blocked_and_durable(state, run_cli, tmp_path):
    up = run_cli("mount", "up", "--name", "m", "--mode", "cached", "--write-back", "1s")
    path = up.stdout.strip().splitlines()[-1]
    res = run_cli("checkpoint", "--size", "16M", "--nproc", "2", "--target", f"{path}/ck", "--iters", "1",
                  "--warmup", "0", "--json", str(tmp_path / "c.json"), timeout=600)
    assert res.returncode == 0, res.stderr
    assert "durable (ms)" in res.stdout and "bucket mount" in res.stdout
    record = json.loads((tmp_path / "c.json").read_text())
    save = next(r for r in record["rows"] if r["op"] == "save")
    # Durable waited at least the write-back delay after the save returned.
    assert save["durable_time_us"] >= save["blocked_time_us"] + 1e6 and save["blocked_is_durable"] is False
    assert record["implementation"]["mount_mode"] == "cached"


@pytest.mark.slow
def test_rclone_killed_under_a_mount_probe_ends_with_one_line(state, run_cli, tmp_path):
    up = run_cli("mount", "up", "--name", "m", "--mode", "cached")
    path = up.stdout.strip().splitlines()[-1]
    os.kill(json.loads((state / "mount-m" / "state.json").read_text())["rclone_pid"], signal.SIGKILL)
    time.sleep(0.5)
    res = run_cli("storage", "posix", "--path", path, "--size", "8M", "--bs", "1M", timeout=60)
    assert res.returncode == 1 and "is dead" in one_error_line(res.stderr)
    res = run_cli("checkpoint", "--size", "8M", "--nproc", "2", "--target", f"{path}/ck", timeout=120)
    assert res.returncode == 1 and "is dead" in one_error_line(res.stderr)
    assert run_cli("mount", "down", "--name", "m").returncode == 0
    assert not _ours_mounted(state)


@pytest.mark.slow
def test_cache_disk_full_during_a_save_exit_1_partial_and_unmountable(state, run_cli, tmp_path):
    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(small)], check=True)
    try:
        up = run_cli("mount", "up", "--name", "m", "--mode", "cached", "--cache-dir", str(small), "--write-back", "30s")
        assert up.returncode == 0, up.stderr
        path = up.stdout.strip().splitlines()[-1]
        res = run_cli("checkpoint", "--size", "64M", "--nproc", "2", "--target", f"{path}/ck",
                      "--json", str(tmp_path / "c.json"), timeout=300)
        assert res.returncode == 1, res.stdout + res.stderr
        one_error_line(res.stderr)
        assert json.loads((tmp_path / "c.json").read_text())["status"] in ("partial", "skipped")
        assert run_cli("mount", "down", "--name", "m").returncode == 0
        assert not _ours_mounted(state)
    finally:
        subprocess.run(["umount", "-l", str(small)])


@pytest.mark.slow
def test_ctrl_c_during_a_drain_says_how_much_was_durable_and_down_still_works(state, tmp_path):
    from conftest import cli_env

    env = cli_env({mount_sys.STATE_ENV: str(state)})
    up = subprocess.run([sys.executable, "-m", "microbench", "mount", "up", "--name", "m", "--mode", "cached",
                         "--write-back", "60s"], env=env, capture_output=True, text=True, cwd=tmp_path)
    path = up.stdout.strip().splitlines()[-1]
    proc = subprocess.Popen([sys.executable, "-m", "microbench", "checkpoint", "--size", "16M", "--nproc", "2",
                             "--target", f"{path}/ck", "--timeout", "120"], env=env, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        # The first save's files reach the mount's cache; the drain then waits out the 60 s delay.
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not list(Path(path).glob("ck/*/step-*/.metadata")):
            time.sleep(0.2)
        time.sleep(1)
        os.killpg(proc.pid, signal.SIGINT)
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 1
    line = one_error_line(err)
    assert "interrupted while the mount's cache drained" in line and "bytes" in line and "were durable" in line
    down = subprocess.run([sys.executable, "-m", "microbench", "mount", "down", "--name", "m"], env=env,
                          capture_output=True, text=True)
    assert down.returncode == 0 and not _ours_mounted(state)


@pytest.mark.slow
def test_a_drain_longer_than_timeout_ends_with_one_line_and_unmounts(state, run_cli):
    res = run_cli("storage", "mount", "--mode", "cached", "--size", "1M", "--write-back", "60", "--timeout", "2",
                  "--iters", "1")
    assert res.returncode == 1 and "not durable within --timeout 2 s" in one_error_line(res.stderr)
    assert not _ours_mounted(state) and not list(state.glob("mount-*"))


@pytest.mark.slow
def test_storage_mount_probe_direct_blocked_is_durable(state, run_cli, tmp_path):
    res = run_cli("storage", "mount", "--mode", "direct", "--size", "4M", "--iters", "1",
                  "--json", str(tmp_path / "m.json"))
    assert res.returncode == 0, res.stderr
    row = json.loads((tmp_path / "m.json").read_text())["rows"][0]
    assert row["blocked_is_durable"] is True and row["durable_time_us"] >= row["blocked_time_us"]
    assert not _ours_mounted(state)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["cached", "direct"])
def test_what_a_write_leaves_in_the_bucket_is_the_bytes_written(state, run_cli, tmp_path, mode):
    """Read back over the S3 API, never through the mount: with 16 MiB upload parts, the object
    is the file, byte for byte, at a size that is neither a page nor a part multiple, written in
    odd-sized pieces."""
    from microbench.targets.mount import facts as mount_facts

    up = run_cli("mount", "up", "--name", "m", "--mode", mode, "--write-back", "1s")
    assert up.returncode == 0, up.stderr
    path = up.stdout.strip().splitlines()[-1]
    payload = os.urandom((33 << 20) + 4097)
    os.mkdir(os.path.join(path, "d"))
    start = time.perf_counter()
    fd = os.open(os.path.join(path, "d", "f"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        for off in range(0, len(payload), 3 << 19):
            os.write(fd, payload[off:off + (3 << 19)])
        os.fsync(fd)
    finally:
        os.close(fd)
    mount_facts.wait_durable(os.path.join(path, "d"), started_at=start, timeout_s=120)
    client, bucket = mount_facts.store_client(path)
    assert client.get_object(Bucket=bucket, Key="d/f")["Body"].read() == payload
