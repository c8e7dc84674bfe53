"""A rank killed with SIGKILL mid-run is named by number in the one error line (issue 20, item 17):
the README promises "a killed rank is named by number", and the checkpoint and link probes said
only what their own library saw (a gloo message cut mid-word, a socket reset)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import cli_env, one_error_line

pytestmark = pytest.mark.slow


def _children(pid: int) -> list[int]:
    kids: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            kids += [int(k) for k in (task / "children").read_text().split()]
        except OSError:
            pass
    return sorted(kids)


def _kill_rank_1_once_a_case_runs(argv: list[str], cwd: Path, record: Path) -> subprocess.CompletedProcess:
    proc = subprocess.Popen([sys.executable, "-m", "microbench", *argv], cwd=cwd, env=cli_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            # Both ranks up and the record claimed: the sweep has started.
            if len(_children(proc.pid)) >= 2 and record.exists():
                break
            time.sleep(0.1)
        ranks = _children(proc.pid)
        assert len(ranks) >= 2, "the launcher never started its two ranks"
        time.sleep(1.0)
        os.kill(ranks[1], signal.SIGKILL)   # the second rank the launcher started: rank 1
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.mark.parametrize("argv", [
    ["checkpoint", "--size", "1G", "--nproc", "2", "--iters", "20", "--warmup", "1", "--timeout", "30"],
    ["link", "--sizes", "64M", "--ops", "uni", "--iters", "500", "--warmup", "1", "--budget", "0", "--timeout", "30"],
], ids=["checkpoint", "link"])
def test_a_killed_rank_is_named_by_number(argv, tmp_path):
    if argv[0] == "checkpoint":
        argv = [*argv, "--target", str(tmp_path / "ck")]
        (tmp_path / "ck").mkdir()
    done = _kill_rank_1_once_a_case_runs([*argv, "--json", "r.json"], tmp_path, tmp_path / "r.json")
    assert done.returncode == 1, done.stderr
    line = one_error_line(done.stderr)
    assert "rank 1 died or stopped responding" in line
    assert "Check the logs of the remote w;" not in line   # no library message cut mid-word
    record = json.loads((tmp_path / "r.json").read_text())
    assert record["status"] == "partial" and "rank 1" in record["status_reason"]
