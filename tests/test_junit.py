"""The suite's JUnit report (accept/junit.py): --junit replaces only a report microbench wrote,
and a --junit that cannot be written is refused before the suite runs."""

from __future__ import annotations

import pytest
from conftest import one_error_line
from test_compare import write_nccl


def test_suite_junit_refuses_to_overwrite_a_record_before_running(cli, tmp_path):
    record = write_nccl(tmp_path / "x.json", {1 << 20: 1.0})
    before = record.read_bytes()
    done = cli("suite", "--only", "memory", "--junit", str(record), "--results-dir", str(tmp_path / "r"))
    assert done.returncode == 2
    line = one_error_line(done.stderr)
    assert f"invalid --junit '{record}': it exists and is not a JUnit report written by microbench" in line
    assert record.read_bytes() == before and not (tmp_path / "r").exists()   # refused before the suite ran


def test_junit_may_replace_a_report_it_wrote_and_nothing_else(tmp_path):
    from microbench.accept import junit

    own = tmp_path / "own.xml"
    own.write_text(junit.build([], None, hostname="h"))
    assert junit.check_writable(own) == own
    foreign = tmp_path / "foreign.xml"
    foreign.write_text('<?xml version="1.0"?><testsuites name="pytest"><testsuite name="x"/></testsuites>')
    text = tmp_path / "notes.txt"
    text.write_text("keep me")
    for path in (foreign, text):
        with pytest.raises(__import__("microbench.core.errors", fromlist=["UsageError"]).UsageError,
                           match="not a JUnit report written by microbench"):
            junit.check_writable(path)


def test_suite_junit_in_a_directory_that_takes_no_file_is_refused_before_running(cli, tmp_path):
    # /proc passes the permission-bit and read-only-mount checks as root, and takes no new file.
    done = cli("suite", "--only", "memory", "--junit", "/proc/j.xml", "--results-dir", str(tmp_path / "r"))
    assert done.returncode == 2
    assert "invalid --junit '/proc/j.xml': cannot create a file in '/proc'" in one_error_line(done.stderr)
    assert not (tmp_path / "r").exists()


@pytest.mark.root
def test_suite_junit_on_a_read_only_filesystem_exit_2_before_running(cli, read_only_dir, tmp_path):
    done = cli("suite", "--only", "memory", "--junit", str(read_only_dir / "acc.xml"),
                   "--results-dir", str(tmp_path / "r"))
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "invalid --junit" in done.stderr and "is on a read-only filesystem" in done.stderr
    assert not (tmp_path / "r").exists()  # no step ran
