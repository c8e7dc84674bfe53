"""`report --out` and `suite --junit` into a directory on a read-only filesystem: refused before
anything runs. As root, permission bits stop nothing, so a read-only mount is the real case."""

from __future__ import annotations

from conftest import last_line
from microbench.results.outputs import why_unwritable


def test_why_unwritable_names_the_read_only_mount(read_only_dir, tmp_path):
    assert why_unwritable(read_only_dir) == f"directory {str(read_only_dir)!r} is on a read-only filesystem"
    assert why_unwritable(tmp_path) is None


def test_report_out_on_a_read_only_filesystem_exit_2_one_line(run_cli, read_only_dir, tmp_path):
    made = run_cli("memory", "--sizes", "1M", "--threads", "1", "--warmup", "0", "--iters", "3",
                   "--json", str(tmp_path / "mem.json"))
    assert made.returncode == 0, made.stderr
    done = run_cli("report", str(tmp_path / "mem.json"), "--out", str(read_only_dir / "r.html"))
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert last_line(done.stderr) == (f"microbench: invalid --out {str(read_only_dir / 'r.html')!r}: directory "
                                      f"{str(read_only_dir)!r} is on a read-only filesystem; e.g. --out results/report.html")
    assert done.stdout == ""


def test_suite_junit_on_a_read_only_filesystem_exit_2_before_running(run_cli, read_only_dir, tmp_path):
    done = run_cli("suite", "--only", "memory", "--junit", str(read_only_dir / "acc.xml"),
                   "--results-dir", str(tmp_path / "r"))
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "invalid --junit" in done.stderr and "is on a read-only filesystem" in done.stderr
    assert not (tmp_path / "r").exists()  # no step ran
