"""Faults that used to break the promises (one line, exit 1, a partial record, no hang):
checkpoint failures and interrupts, frozen or mute masters, signals close together or during
start-up, worlds of one, too many local ranks, and how fast and whom a failure is blamed on."""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from conftest import cli_env

from microbench.errors import RunError
from microbench.probes import checkpoint as ck


def one_error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert lines[0].startswith("microbench: ") and "Traceback" not in stderr
    return lines[0]


def records(tmp_path, pattern="*.json"):
    return [json.loads(p.read_text()) for p in sorted((tmp_path / "results").glob(pattern))]


# ---------------------------------------------------------------- 7: checkpoint failures
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


def _mount_tmpfs(path, options):
    path.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.decode().strip()}")


@pytest.mark.slow
@pytest.mark.root
def test_disk_full_mid_save_is_one_line_and_a_partial_record(run_cli, tmp_path):
    # Room for the bytes (the free-space check passes) but four inodes: the mount point and the
    # run's three directories. The first file DCP creates gets ENOSPC, as on a full disk.
    mnt = tmp_path / f"mnt-{uuid.uuid4().hex[:6]}"
    _mount_tmpfs(mnt, "size=256m,nr_inodes=4")
    try:
        proc = run_cli("checkpoint", "--size", "16M", "--nproc", "2", "--target", str(mnt / "ck"),
                       "--warmup", "0", "--iters", "1", "--timeout", "60", timeout=120)
        left = os.listdir(mnt)
    finally:
        subprocess.run(["umount", str(mnt)], check=False)
    assert proc.returncode == 1
    line = one_error_line(proc.stderr)
    assert "checkpoint save to" in line and "No space left on device" in line and "(partial)" in line
    (record,) = records(tmp_path)
    assert record["status"] == "partial" and "No space left on device" in record["status_reason"]
    assert left == []


def _ranks_of(pid):
    """Rank number -> pid of the ranks a launcher started."""
    out = {}
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat) as handle:
                ppid = int(handle.read().rsplit(")", 1)[1].split()[1])
            if ppid != pid:
                continue
            child = int(stat.split("/")[2])
            with open(f"/proc/{child}/environ", "rb") as handle:
                env = dict(i.split(b"=", 1) for i in handle.read().split(b"\0") if b"=" in i)
            out[int(env[b"RANK"])] = child
        except (OSError, ValueError, KeyError, IndexError):
            continue
    return out


def _wait_for(predicate, proc, what, limit_s=120.0):
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline and proc.poll() is None:
        if predicate():
            return
        time.sleep(0.01)
    proc.kill()
    pytest.fail(f"never saw {what}: {proc.communicate()}")


def _rows_written(tmp_path, count):
    def check():
        files = list((tmp_path / "results").glob("*.json"))
        try:
            return files and len(json.loads(files[0].read_text())["rows"]) >= count
        except (ValueError, OSError):
            return False

    return check


@pytest.mark.slow
@pytest.mark.parametrize("phase, second", [("save", None), ("save", "SIGTERM"), ("load", None)])
def test_ctrl_c_during_a_save_or_load(tmp_path, phase, second):
    target = tmp_path / "ck"
    proc = subprocess.Popen([sys.executable, "-m", "microbench", "checkpoint", "--size", "256M", "--nproc", "2",
                             "--target", str(target), "--warmup", "0", "--iters", "8", "--timeout", "30"],
                            cwd=tmp_path, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if phase == "save":
        _wait_for(lambda: glob.glob(str(target / "*" / "step-*" / "*.distcp")), proc, "a save under way")
    else:  # the save row is written; the load case then loads from the save's checkpoint 8 times
        _wait_for(_rows_written(tmp_path, 1), proc, "the save case finished")
        time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    if second:  # as a scheduler does: Ctrl-C, then SIGTERM right after
        time.sleep(0.05)
        proc.send_signal(getattr(signal, second))
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1
    line = one_error_line(err)
    assert line.startswith("microbench: interrupted") and "(partial)" in line
    (record,) = records(tmp_path)
    assert record["status"] == "partial" and record["status_reason"].startswith("interrupted")
    assert len(record["rows"]) == (1 if phase == "load" else 0)
    assert not target.exists()


# ---------------------------------------------------------------- 10: a world of one
def test_fit_of_a_world_of_one_has_no_bus_model():
    from microbench.fit import fit_latency_bandwidth

    rows = [{"size_bytes": s, "time_us": {"p50": 10 + s / 1e4}, "algbw_gbps": s / (10 + s / 1e4) / 1e3,
             "busbw_gbps": 0.0, "placement": "out"} for s in (1 << 20, 1 << 22)]
    fit = fit_latency_bandwidth(rows)
    assert fit["points"] == 0 and "busbw is 0" in fit["reason"]


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


@pytest.mark.slow
def test_verify_fsdp_with_one_rank(run_cli, tmp_path):
    # The mechanism, not this machine's accuracy: a loose tolerance so the verdict can't fail it.
    proc = run_cli("verify", "fsdp", "--nproc", "1", "--timeout", "20", "--tolerance", "1000",
                   "--ckpt-tolerance", "1000", timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "ZeroDivisionError" not in proc.stderr + proc.stdout
    assert "1 ranks" in proc.stdout and "measured" in proc.stdout


# ---------------------------------------------------------------- 11: how many local ranks
def test_local_world_limit_rule(monkeypatch):
    from microbench import supervise as dist

    monkeypatch.setattr(dist.os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(dist, "_mem_available_bytes", lambda: 64 << 30)
    limit, rule = dist.local_world_limit()
    assert (limit, rule) == (16, "8 per CPU core x 2 core(s)")
    monkeypatch.setattr(dist, "_mem_available_bytes", lambda: 1 << 30)
    assert dist.local_world_limit() == (4, "1.0 GiB available / 256 MiB per rank")


@pytest.mark.parametrize("command", [["nccl", "--sizes", "1M"], ["checkpoint", "--size", "1G", "--target", "ck"],
                                     ["verify", "fsdp"]])
def test_too_many_local_ranks_are_refused_before_any_starts(run_cli, tmp_path, command):
    from microbench.supervise import local_world_limit

    limit, rule = local_world_limit()
    proc = run_cli(*command, "--nproc", "1000", "--timeout", "5", timeout=60)
    assert proc.returncode == 2
    line = one_error_line(proc.stderr)
    assert f"invalid --nproc 1000: this machine runs at most {limit} local ranks ({rule})" in line
    assert f"--nproc {limit} or fewer" in line and "torchrun/srun/mpirun" in line
    assert proc.stdout == "" and not (tmp_path / "results").exists() and not (tmp_path / "ck").exists()


def test_a_launched_world_is_not_bounded(run_cli):
    import socket

    with socket.socket() as sock:  # bound, never listening: the master is absent
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        proc = run_cli("nccl", "--sizes", "1M", "--timeout", "2", timeout=60,
                       env={"RANK": "999", "WORLD_SIZE": "1000", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    assert proc.returncode == 1  # it tried to join: the launcher's world, not ours to refuse
    assert "rank 999 could not reach the master" in one_error_line(proc.stderr)


# ---------------------------------------------------------------- 8: frozen or mute masters
@pytest.fixture
def mute_master():
    """A TCP port that accepts connections and never says a word."""
    import socket
    import threading

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    accepted = []
    stop = threading.Event()

    def serve():
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                accepted.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    for conn in accepted:
        conn.close()
    server.close()


@pytest.mark.slow
def test_a_master_that_accepts_and_never_answers(run_cli, mute_master):
    start = time.monotonic()
    proc = run_cli("nccl", "--sizes", "1M", "--timeout", "5", timeout=60,
                   env={"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(mute_master)})
    elapsed = time.monotonic() - start
    assert proc.returncode == 1
    line = one_error_line(proc.stderr)
    assert f"the master at 127.0.0.1:{mute_master} accepted the connection but did not answer within 5 s" in line
    assert elapsed < 5 + 10  # --timeout plus interpreter and torch start-up on a busy machine


def _start_sweep(tmp_path, timeout="5"):
    proc = subprocess.Popen([sys.executable, "-m", "microbench", "nccl", "--sizes", "256K-128M", "--ops", "all_reduce",
                             "--nproc", "2", "--timeout", timeout, "--iters", "20", "--budget", "0"],
                            cwd=tmp_path, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def two_rows():
        files = list((tmp_path / "results").glob("*.json"))
        try:
            return files and len(json.loads(files[0].read_text())["rows"]) >= 2
        except (ValueError, OSError):
            return False

    _wait_for(two_rows, proc, "two finished sizes")
    return proc


@pytest.mark.slow
@pytest.mark.parametrize("frozen", [0, 1])
def test_a_frozen_rank_ends_the_run_within_the_timeout(tmp_path, frozen):
    proc = _start_sweep(tmp_path)
    ranks = _ranks_of(proc.pid)
    os.kill(ranks[frozen], signal.SIGSTOP)
    stopped_at = time.monotonic()
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        for pid in ranks.values():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    elapsed = time.monotonic() - stopped_at
    assert proc.returncode == 1
    line = one_error_line(err)
    assert f"rank {frozen} died or stopped responding during all_reduce" in line
    assert elapsed < 5 + 2.5, elapsed  # --timeout 5, a second of heartbeats, the exit: not ~6 s more
    (record,) = records(tmp_path)
    assert record["status"] == "partial" and f"rank {frozen}" in record["status_reason"]
    assert len(record["rows"]) >= 2 and "(partial)" in line


# ---------------------------------------------------------------- 9: signals
@pytest.mark.slow
@pytest.mark.parametrize("signals", [("SIGINT", "SIGTERM"), ("SIGTERM", "SIGINT"), ("SIGINT", "SIGINT")])
def test_two_signals_close_together_keep_the_partial_record(tmp_path, signals):
    proc = _start_sweep(tmp_path)
    for name in signals:
        proc.send_signal(getattr(signal, name))
        time.sleep(0.02)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    line = one_error_line(err)
    assert line.startswith("microbench: interrupted") and "(partial)" in line
    (record,) = records(tmp_path)
    assert record["status"] == "partial" and len(record["rows"]) >= 2


def _start(tmp_path):
    return subprocess.Popen([sys.executable, "-m", "microbench", "nccl", "--sizes", "1M-64M", "--ops", "all_reduce",
                             "--nproc", "2", "--timeout", "30"],
                            cwd=tmp_path, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
@pytest.mark.parametrize("moment", ["importing", "ranks starting", "ranks joining"])
@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM"])
def test_a_signal_during_start_up(tmp_path, moment, signame):
    proc = _start(tmp_path)
    if moment == "importing":
        # Once the native core is mapped the launcher runs our code, importing. (Before the
        # interpreter has read its site-packages, no Python program can catch a signal.)
        def importing():
            try:
                with open(f"/proc/{proc.pid}/maps") as handle:
                    return "_native" in handle.read()
            except OSError:
                return False

        _wait_for(importing, proc, "microbench being imported", 60)
    else:
        _wait_for(lambda: len(_ranks_of(proc.pid)) == 2, proc, "two ranks", 60)
        if moment == "ranks joining":
            time.sleep(1.5)
    sent = time.monotonic()
    proc.send_signal(getattr(signal, signame))
    out, err = proc.communicate(timeout=60)
    assert time.monotonic() - sent < 10  # not the 30 s --timeout: nothing to save yet
    assert proc.returncode == 1
    line = one_error_line(err)
    assert line.startswith("microbench: interrupted")
    for record in records(tmp_path):
        assert record["status"] == "partial"


# ---------------------------------------------------------------- 12: whom a lab failure blames
@pytest.fixture
def h7b_lab():
    from conftest import namespaces_refused
    from microbench import lab as labmod

    reason = namespaces_refused()
    if reason:
        pytest.skip(reason)
    name = "h7b" + uuid.uuid4().hex[:5]
    labmod.up(name, 2, None)
    yield name
    labmod.down(name)
    assert labmod.find(name) is None


@pytest.mark.slow
@pytest.mark.root
@pytest.mark.parametrize("host", [0, 1])
def test_a_link_down_in_the_lab_is_blamed_on_its_host(tmp_path, h7b_lab, host):
    proc = subprocess.Popen([sys.executable, "-m", "microbench", "nccl", "--lab", h7b_lab, "--sizes", "256K-128M",
                             "--ops", "all_reduce", "--timeout", "5", "--iters", "20", "--budget", "0"],
                            cwd=tmp_path, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def two_rows():
        files = list((tmp_path / "results").glob("*.json"))
        try:
            return files and len(json.loads(files[0].read_text())["rows"]) >= 2
        except (ValueError, OSError):
            return False

    _wait_for(two_rows, proc, "two finished sizes")
    subprocess.run(["ip", "link", "set", f"mb-{h7b_lab}-v{host}", "down"], check=True)
    down_at = time.monotonic()
    out, err = proc.communicate(timeout=60)
    elapsed = time.monotonic() - down_at
    assert proc.returncode == 1
    line = one_error_line(err)
    if host == 0:
        assert "rank 0 lost its own network link (lab0 is" in line and "rank 1 unreachable" in line
        assert "rank 1 died" not in line
    else:
        assert "rank 1 died or stopped responding" in line
    assert f"lab host mb-{h7b_lab}-h{host} " in line and "(partial)" in line
    assert elapsed < 5 + 3, elapsed  # --timeout, a second of heartbeats, the lab's own diagnosis
    (record,) = records(tmp_path)
    assert record["status"] == "partial"
