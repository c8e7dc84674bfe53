"""Every bad input and fault the nccl issue names: exit code, one stderr line that quotes the
value, no traceback, no hang."""

import json
import os
import signal
import socket
import time

import pytest

from conftest import children, join_nccl, one_error_line, ranks_of, start_nccl_sweep

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("args, code, fragments", [
    (["--sizes", "1X-4G"], 2, ["'1X-4G'", "'1X' is not a size", "e.g. 1M-4G"]),
    (["--sizes", "4G-1M"], 2, ["'4G-1M'", "starts above its end", "e.g. 1M-4G"]),
    (["--sizes", "0"], 2, ["'0'", "greater than zero"]),
    (["--sizes", "-5M"], 2, ["'-5M'", "cannot be negative"]),
    (["--ops", "all_reduce,gather"], 2, ["'gather'", "reduce_scatter, all_gather, all_reduce, broadcast, all_to_all"]),
    (["--dtype", "int8"], 2, ["'int8'", "float32, bfloat16, float16"]),
    (["--nproc", "0"], 2, ["'0'", "--nproc", "at least 1"]),
    (["--factor", "1"], 2, ["--factor", "more than 1"]),
    (["--timeout", "soon"], 2, ["'soon'", "--timeout 60"]),
    (["--backend", "gloo", "--transport", "ib"], 2, ["'ib'", "gloo only speaks TCP"]),
    (["--backend", "nccl"], 0, ["skipped", "needs a CUDA GPU"]),
])
def test_bad_input(run_cli, tmp_path, args, code, fragments):
    res = run_cli("nccl", *args, timeout=60)
    assert res.returncode == code
    line = one_error_line(res.stderr)
    for fragment in fragments:
        assert fragment in line
    assert res.stdout == ""
    if code == 2:
        assert not (tmp_path / "results").exists()
    else:  # a skip leaves its record, with the reason and no rows
        (written,) = (tmp_path / "results").iterdir()
        record = json.loads(written.read_text())
        assert record["status"] == "skipped" and "needs a CUDA GPU" in record["status_reason"]
        assert record["kind"] == "nccl" and record["rows"] == []


def test_sizes_that_do_not_fit_are_refused_before_allocating(cli, tmp_path):
    res = cli("nccl", "--sizes", "64G", "--nproc", "2", timeout=60)
    assert res.returncode == 2
    line = one_error_line(res.stderr)
    assert "no size of --sizes fits in host memory for 2 rank(s): the smallest case, all_reduce in-place 64G " \
           "needs 128.5 GiB" in line
    assert "may be taken (90% of the" in line and "e.g. --sizes 1M-" in line
    assert not (tmp_path / "results").exists()  # no rank was started


def closed_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.xdist_group("timed")
def test_unreachable_master_fails_within_the_timeout(run_cli):
    port = closed_port()
    res, elapsed = join_nccl(run_cli, 1, port)
    assert res.returncode == 1
    line = one_error_line(res.stderr)
    assert f"rank 1 could not reach the master at 127.0.0.1:{port} within 5 s (--timeout)" in line
    # 5 s of waiting plus interpreter and torch start-up on a busy machine; TCPStore alone
    # would retry for two timeouts and more.
    assert elapsed < 5 + 20


def test_a_taken_master_port_is_named(run_cli):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        res, _ = join_nccl(run_cli, 0, port)
    assert res.returncode == 1
    line = one_error_line(res.stderr)
    assert f"MASTER_PORT {port} on 127.0.0.1 is already in use" in line and "MASTER_PORT=" in line


def _start_sweep(tmp_path):
    """A sweep long enough to be interrupted, and its record (rows appear as sizes finish)."""
    proc = start_nccl_sweep(tmp_path)
    return proc, next((tmp_path / "results").glob("*.json"))


def _finished_rows(path):
    record = json.loads(path.read_text())
    assert record["status"] == "partial", record["status"]
    sizes = [row["size_bytes"] for row in record["rows"]]
    assert len(sizes) >= 2 and sizes == sorted(sizes) and sizes[0] == 256 << 10
    assert all(row["nwrong"] == 0 for row in record["rows"])
    return record


@pytest.mark.xdist_group("timed")
def test_a_rank_killed_mid_sweep(tmp_path):
    proc, path = _start_sweep(tmp_path)
    os.kill(ranks_of(proc.pid)[1], signal.SIGKILL)
    killed_at = time.monotonic()
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    # Rank 0 must notice and leave within --timeout (5 s) plus start-of-exit slack; a hang
    # would run to the communicate() timeout.
    assert time.monotonic() - killed_at < 5 + 10
    line = one_error_line(err)
    assert "rank 1 died or stopped responding during all_reduce" in line
    assert f"in {os.path.join('results', path.name)} (partial)" in line
    record = _finished_rows(path)
    assert "rank 1" in record["status_reason"]


def test_ctrl_c_keeps_a_partial_record(tmp_path):
    proc, path = _start_sweep(tmp_path)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    line = one_error_line(err)
    assert line.startswith("microbench: interrupted during all_reduce") and "(partial)" in line
    record = _finished_rows(path)
    assert record["status_reason"].startswith("interrupted")
    assert children(proc.pid) == []
