"""`report --out` and `suite --junit` into a directory on a read-only filesystem: refused before
anything runs. As root, permission bits stop nothing, so a read-only mount is the real case."""

from __future__ import annotations

import os
import subprocess

import pytest

from conftest import last_line
from microbench.workdir import why_unwritable


@pytest.fixture
def readonly_dir(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mounting a read-only tmpfs needs root")
    target = tmp_path / "ro"
    target.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro", "tmpfs", str(target)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a read-only tmpfs here: {done.stderr.strip()}")
    try:
        yield target
    finally:
        subprocess.run(["umount", str(target)], check=True)


def test_why_unwritable_names_the_read_only_mount(readonly_dir, tmp_path):
    assert why_unwritable(readonly_dir) == f"directory {str(readonly_dir)!r} is on a read-only filesystem"
    assert why_unwritable(tmp_path) is None


def test_report_out_on_a_read_only_filesystem_exit_2_one_line(run_cli, readonly_dir, tmp_path):
    made = run_cli("memory", "--sizes", "1M", "--threads", "1", "--warmup", "0", "--iters", "3",
                   "--json", str(tmp_path / "mem.json"))
    assert made.returncode == 0, made.stderr
    done = run_cli("report", str(tmp_path / "mem.json"), "--out", str(readonly_dir / "r.html"))
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert last_line(done.stderr) == (f"microbench: invalid --out {str(readonly_dir / 'r.html')!r}: directory "
                                      f"{str(readonly_dir)!r} is on a read-only filesystem; e.g. --out results/report.html")
    assert done.stdout == ""


def test_suite_junit_on_a_read_only_filesystem_exit_2_before_running(run_cli, readonly_dir, tmp_path):
    done = run_cli("suite", "--only", "memory", "--junit", str(readonly_dir / "acc.xml"),
                   "--results-dir", str(tmp_path / "r"))
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "invalid --junit" in done.stderr and "is on a read-only filesystem" in done.stderr
    assert not (tmp_path / "r").exists()  # no step ran
