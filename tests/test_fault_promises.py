"""Faults that used to break the promises (one line, exit 1, a partial record, no hang):
checkpoint failures and interrupts, frozen or mute masters, signals close together or during
start-up, worlds of one, too many local ranks, and how fast and whom a failure is blamed on."""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from conftest import cli_env, join_nccl, one_error_line, ranks_of, records, rows_written, start_nccl_sweep, tmpfs, wait_for

from microbench.core.errors import RunError
from microbench.probes import checkpoint as ck


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


# ---------------------------------------------------------------- 10: a world of one
def test_fit_of_a_world_of_one_has_no_bus_model():
    from microbench.core.fit import fit_latency_bandwidth

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
    # The mechanism, not this machine's accuracy: a world of one is measured and predicted to the
    # end. A verdict outside even a loose tolerance is this box's load (seen: +1787% at load 10
    # with a one-rank step of a few ms), not a fault; anything else is.
    proc = run_cli("verify", "fsdp", "--nproc", "1", "--timeout", "20", "--tolerance", "1000",
                   "--ckpt-tolerance", "1000", "--cal-reps", "3", timeout=300)
    assert proc.returncode == 0 or "outside the tolerance" in proc.stderr, proc.stderr
    assert "ZeroDivisionError" not in proc.stderr + proc.stdout
    assert "1 ranks" in proc.stdout and "measured" in proc.stdout


# ---------------------------------------------------------------- 11: how many local ranks
def test_local_world_limit_rule(monkeypatch):
    from microbench.world import supervisor as dist

    monkeypatch.setattr(dist.os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(dist, "_mem_available_bytes", lambda: 64 << 30)
    limit, rule = dist.local_world_limit()
    assert (limit, rule) == (16, "8 per CPU core x 2 core(s)")
    monkeypatch.setattr(dist, "_mem_available_bytes", lambda: 1 << 30)
    assert dist.local_world_limit() == (4, "1.0 GiB available / 256 MiB per rank")


@pytest.mark.parametrize("command", [["nccl", "--sizes", "1M"], ["checkpoint", "--size", "1G", "--target", "ck"],
                                     ["verify", "fsdp"]])
def test_too_many_local_ranks_are_refused_before_any_starts(run_cli, tmp_path, command):
    from microbench.world.supervisor import local_world_limit

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
        proc, _ = join_nccl(run_cli, 999, port, world=1000, timeout="2")
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
    proc, elapsed = join_nccl(run_cli, 1, mute_master)
    assert proc.returncode == 1
    line = one_error_line(proc.stderr)
    assert f"the master at 127.0.0.1:{mute_master} accepted the connection but did not answer within 5 s" in line
    assert elapsed < 5 + 10  # --timeout plus interpreter and torch start-up on a busy machine


@pytest.mark.slow
@pytest.mark.parametrize("frozen", [0, 1])
def test_a_frozen_rank_ends_the_run_within_the_timeout(tmp_path, frozen):
    proc = start_nccl_sweep(tmp_path)
    ranks = ranks_of(proc.pid)
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
    proc = start_nccl_sweep(tmp_path)
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

        wait_for(importing, proc, "microbench being imported", 60)
    else:
        wait_for(lambda: len(ranks_of(proc.pid)) == 2, proc, "two ranks", 60)
        if moment == "ranks joining":
            time.sleep(1.5)
    sent = time.monotonic()
    proc.send_signal(getattr(signal, signame))
    out, err = proc.communicate(timeout=60)
    assert time.monotonic() - sent < 10  # not the 30 s --timeout: nothing to save yet
    assert proc.returncode == 1, err
    line = one_error_line(err)
    assert line.startswith("microbench: interrupted")
    for record in records(tmp_path):
        assert record["status"] == "partial"


# ---------------------------------------------------------------- 12: whom a lab failure blames
@pytest.fixture
def h7b_lab(lab_name):
    from microbench.lab import namespaces as labmod

    labmod.up(lab_name, 2, None)
    return lab_name  # lab_name takes it down again


@pytest.mark.slow
@pytest.mark.root
@pytest.mark.parametrize("host", [0, 1])
def test_a_link_down_in_the_lab_is_blamed_on_its_host(tmp_path, h7b_lab, host):
    proc = start_nccl_sweep(tmp_path, lab=h7b_lab)
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
