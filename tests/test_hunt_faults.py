"""`hunt` under a hostile run: a rank killed mid-round is named (exit 1, one line, the record
partial), a reader that leaves ends it quietly with 141 and the record partial, and an existing
--heatmap is refused before any pair is measured."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import cli_env, head_1, one_error_line, ranks_of, wait_for


@pytest.fixture
def lab3(run_cli, lab_name):
    up = run_cli("lab", "up", "--hosts", "3", "--link", "1gbit", "--name", lab_name)
    assert up.returncode == 0, up.stderr
    return lab_name


@pytest.mark.root
@pytest.mark.slow
def test_a_rank_killed_during_hunt_is_named(lab3, tmp_path):
    record = tmp_path / "h.json"
    proc = subprocess.Popen([sys.executable, "-m", "microbench", "hunt", "--lab", lab3, "--size", "64M", "--iters", "8",
                             "--timeout", "10", "--json", str(record)], cwd=tmp_path, env=cli_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: record.exists() and len(ranks_of(proc.pid, deep=True)) == 3, proc, "the record and 3 ranks")
    time.sleep(0.5)   # inside the first round's transfers
    os.kill(ranks_of(proc.pid, deep=True)[1], signal.SIGKILL)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, err
    line = one_error_line(err)
    assert line.startswith("microbench: rank 1 died or stopped responding during all pairs round 1"), line
    assert line.endswith(f"in {record} (partial)")
    data = json.loads(record.read_text())
    assert data["status"] == "partial" and data["status_reason"].startswith("rank 1 died")


@pytest.mark.root
@pytest.mark.slow
def test_hunt_piped_into_head_1_exit_141_and_the_record_partial(lab3, tmp_path):
    code, first, err = head_1(["hunt", "--lab", lab3, "--size", "1M", "--iters", "1"], tmp_path)
    assert first.startswith("# microbench hunt: 3 hosts") and code == 141 and err == ""
    (record,) = [json.loads(p.read_text()) for p in (tmp_path / "results").glob("*.json")]
    assert record["status"] == "partial" and record["status_reason"] == "stdout closed by its reader"


@pytest.mark.slow
@pytest.mark.root
def test_an_existing_heatmap_is_refused_before_the_pairs(run_cli, lab3, tmp_path):
    (tmp_path / "h.png").write_bytes(b"mine")
    start = time.monotonic()
    done = run_cli("hunt", "--lab", lab3, "--heatmap", "h.png", timeout=60)
    assert done.returncode == 2 and time.monotonic() - start < 10
    assert one_error_line(done.stderr) == ("microbench: invalid --heatmap 'h.png': it exists; files are never "
                                           "overwritten: pick a new name, e.g. --heatmap h-2.png")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["h.png"] and done.stdout == ""
