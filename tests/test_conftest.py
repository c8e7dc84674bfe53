"""The suite's own rules (conftest.py): the markers a test's fixtures call for, and the in-process
command line that refuses to start real work."""

from __future__ import annotations

from conftest import ROOT_FIXTURES, SLOW_FIXTURES, missing_markers


def test_a_lab_test_must_be_marked_root_and_slow():
    assert missing_markers({"lab", "tmp_path"}, set()) == ["root", "slow"]
    assert missing_markers({"lab_name"}, {"root"}) == ["slow"]
    assert missing_markers({"lab"}, {"root", "slow"}) == []


def test_a_read_only_mount_needs_root_and_a_cli_child_is_slow():
    assert missing_markers({"read_only_dir", "cli"}, set()) == ["root"]
    assert missing_markers({"run_cli"}, set()) == ["slow"]
    assert missing_markers({"embedded_s3"}, {"slow"}) == []
    assert missing_markers({"cli", "tmp_path", "capsys"}, set()) == []
    assert "cli" not in SLOW_FIXTURES | ROOT_FIXTURES


def test_the_in_process_cli_returns_what_a_child_would(cli, tmp_path):
    done = cli("memory", "--sizes", "1M", "--budget", "nan")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == "microbench: invalid --budget 'nan': expected a finite number, e.g. --budget 2\n"
    assert list(tmp_path.iterdir()) == []
    assert cli("--version").returncode == 0


def test_the_in_process_cli_refuses_to_start_ranks(cli, tmp_path):
    done = cli("nccl", "--sizes", "1M", "--nproc", "2", "--iters", "1", "--warmup", "0")
    assert done.returncode == 1
    assert "StartedProcesses" in done.stderr and "use run_cli" in done.stderr
