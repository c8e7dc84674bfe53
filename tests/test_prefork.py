"""Steps and ranks forked from a warm process (prefork.py): the same records, exit codes and
Ctrl-C behaviour as fresh interpreters, and the record says how the process started."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest
from conftest import cli_env, descendants, one_error_line, rows_written, wait_for

from microbench.world import fork as prefork

# A launcher that warms itself as the suite does, then runs the CLI: its ranks are forks.
WARM_CLI = ("import microbench.__main__; from microbench.world import fork as prefork; assert prefork.warm(); "
            "from microbench.__main__ import entry; entry()")


def warm_cli(tmp_path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", WARM_CLI, *args], cwd=tmp_path, env=cli_env(),
                          capture_output=True, text=True, timeout=timeout)


def test_no_fork_where_a_gpu_could_be(monkeypatch):
    monkeypatch.setattr(prefork, "_warm", False)
    monkeypatch.setattr(prefork, "gpu_possible", lambda: True)
    assert prefork.warm() is False and prefork.ready() is False


@pytest.mark.slow
def test_a_warm_launcher_forks_its_ranks_and_the_record_says_so(tmp_path):
    done = warm_cli(tmp_path, "nccl", "--nproc", "2", "--sizes", "64K-128K", "--ops", "all_reduce",
                    "--iters", "2", "--warmup", "1", "--budget", "0", "--json", "x.json")
    assert done.returncode == 0, done.stderr
    record = json.loads((tmp_path / "x.json").read_text())
    assert record["status"] == "complete" and len(record["rows"]) == 2
    assert record["environment"]["process_start"] == "fork"
    assert all(row["nwrong"] == 0 and row["ranks"] == 2 for row in record["rows"])
    cold = subprocess.run([sys.executable, "-m", "microbench", "nccl", "--nproc", "2", "--sizes", "64K", "--ops",
                           "all_reduce", "--iters", "2", "--warmup", "1", "--json", "y.json"],
                          cwd=tmp_path, env=cli_env(), capture_output=True, text=True, timeout=300)
    assert cold.returncode == 0, cold.stderr
    assert json.loads((tmp_path / "y.json").read_text())["environment"]["process_start"] == "exec"


@pytest.mark.slow
def test_a_forked_process_exits_as_a_fresh_one_would(tmp_path):
    code = """
import json, subprocess, sys, tempfile
import microbench.__main__

import pytest
from microbench.world import fork as prefork
assert prefork.warm()
out = {}
for name, argv in [("ok", ["memory", "--sizes", "1M", "--iters", "2", "--warmup", "0", "--json", "m.json"]),
                   ("usage", ["memory", "--sizes", "-1M"]), ("argparse", ["memory", "--no-such-option"])]:
    with tempfile.TemporaryFile(mode="w+") as err:
        child = prefork.start(argv, dict(__import__("os").environ), stdout=subprocess.DEVNULL, stderr=err)
        rc = child.wait(120)
        err.seek(0)
        out[name] = (rc, err.read())
print(json.dumps(out))
"""
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=cli_env(), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["ok"][0] == 0, out["ok"][1]
    assert json.loads((tmp_path / "m.json").read_text())["environment"]["process_start"] == "fork"
    assert out["usage"][0] == 2 and "-1M" in one_error_line(out["usage"][1])
    assert out["argparse"][0] == 2 and "--no-such-option" in out["argparse"][1]


@pytest.mark.slow
def test_ctrl_c_on_a_warm_launcher_keeps_the_partial_record_and_leaves_no_rank(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", WARM_CLI, "nccl", "--sizes", "256K-128M", "--ops", "all_reduce",
                             "--nproc", "2", "--timeout", "5", "--iters", "20", "--budget", "0"],
                            cwd=tmp_path, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(rows_written(tmp_path, 2), proc, "two finished sizes")
    ranks = descendants(proc.pid)
    assert len(ranks) >= 2
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err
    assert "interrupted" in one_error_line(err)
    record = json.loads(next((tmp_path / "results").glob("*.json")).read_text())
    assert record["status"] == "partial" and len(record["rows"]) >= 2
    assert record["environment"]["process_start"] == "fork"
    time.sleep(0.2)
    assert not [pid for pid in ranks if _alive(pid)]


@pytest.mark.slow
def test_the_suite_forks_its_steps(tmp_path):
    done = subprocess.run([sys.executable, "-m", "microbench", "suite", "--only", "memory", "--results-dir", "r"],
                          cwd=tmp_path, env=cli_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    record = json.loads(next((tmp_path / "r").glob("suite-*/memory.json")).read_text())
    assert record["status"] == "complete" and record["environment"]["process_start"] == "fork"
    assert record["environment"]["torch"]  # the torch facts, asked in the warm suite itself


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False
