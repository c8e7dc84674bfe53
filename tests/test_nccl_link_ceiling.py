"""busbw as a share of the link measured in the same run (--measure-link)."""

import json

import pytest
from conftest import last_line


@pytest.mark.slow
def test_measure_link_states_busbw_against_it(run_cli, tmp_path):
    out = tmp_path / "n.json"
    done = run_cli("nccl", "--sizes", "1M-4M", "--ops", "all_gather", "--nproc", "2", "--measure-link",
                   "--warmup", "1", "--iters", "3", "--json", str(out), timeout=240)
    assert done.returncode == 0, done.stderr
    summary = json.loads(out.read_text())["summary"]
    assert summary["link_from"] == "measured in this run" and summary["link_gbps"] > 0
    assert "% of the measured link" in done.stdout


@pytest.mark.slow
def test_measure_link_needs_two_ranks(run_cli):
    done = run_cli("nccl", "--sizes", "1M", "--nproc", "3", "--measure-link", "--timeout", "30", timeout=240)
    assert done.returncode == 2
    assert "--measure-link needs exactly 2 ranks (this world has 3)" in last_line(done.stderr)
