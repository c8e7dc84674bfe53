"""Issue 20, items 1-8 and 17: each a hostile user's reproduction that broke on main."""

from __future__ import annotations

import json
import math

import pytest

from conftest import last_line, one_error_line
from test_compare import write_nccl


# ---------------------------------------------------------------- item 8: a NaN does not pass a gate

@pytest.mark.parametrize("new_value, how", [(math.nan, "nan in NEW"), (None, "missing in NEW")])
def test_compare_fail_on_fails_a_nan_or_missing_value_and_names_it(run_cli, tmp_path, new_value, how):
    base = write_nccl(tmp_path / "a.json", {1 << 20: 1.0, 1 << 24: 4.0})
    new = write_nccl(tmp_path / "b.json", {1 << 20: 1.0, 1 << 24: 4.0})
    record = json.loads(new.read_text())
    record["rows"][1]["busbw_gbps"] = new_value   # json writes NaN, as Python's own dumps does
    if new_value is None:
        del record["rows"][1]["busbw_gbps"]
    new.write_text(json.dumps(record))
    done = run_cli("compare", str(base), str(new), "--fail-on", "busbw:-5%")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "all within" not in done.stdout
    assert one_error_line(done.stderr) == ("microbench: 1 of 2 compared value(s) broke --fail-on (busbw:-5%); "
                                           f"worst: nccl all_reduce 16M busbw {how}")
    assert f"FAIL busbw:-5% ({how})" in done.stdout


# ---------------------------------------------------------------- item 1: a URL password never becomes text

PW = "S3CRETPW"
URL = f"http://u:{PW}@127.0.0.1:1"


@pytest.mark.parametrize("failure", [
    # botocore's own text, as a library exception the runner diagnoses
    OSError(f'Could not connect to the endpoint URL: "{URL}/b/obj"'),
    # one of ours, quoting the endpoint as given
    __import__("microbench.core.errors", fromlist=["RunError"]).RunError(f"failed listing bucket at {URL}: x"),
])
def test_a_url_password_in_any_failure_reaches_neither_the_record_nor_the_message(tmp_path, failure):
    from microbench.run.runner import SweepSettings, run_probe
    from test_results_store import FailingProbe

    settings = SweepSettings(warmup=1, iters=2, budget_s_per_case=None, progress=False)
    with pytest.raises(Exception) as info:
        run_probe(FailingProbe(failure), settings, config={}, results_dir=str(tmp_path))
    (path,) = tmp_path.glob("*.json")
    record = json.loads(path.read_text())
    assert record["status"] == "partial" and "u:<redacted>@127.0.0.1:1" in record["status_reason"]
    assert PW not in path.read_text()
    assert PW not in str(info.value) and "u:<redacted>@" in str(info.value)


def test_storage_s3_and_checkpoint_on_a_closed_port_never_print_the_password(run_cli):
    env = {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"}
    s3 = run_cli("storage", "s3", "--endpoint", URL, "--bucket", "b", env=env, timeout=120)
    assert s3.returncode == 1 and "Could not connect to the endpoint URL" in s3.stderr  # botocore's quoted URL
    ck = run_cli("checkpoint", "--target", "s3://b/p", "--endpoint", URL, env=env, timeout=120)
    assert ck.returncode == 1 and "cannot reach the S3 endpoint" in ck.stderr
    for done in (s3, ck):
        line = one_error_line(done.stderr)
        assert PW not in done.stderr + done.stdout and "u:<redacted>@127.0.0.1:1" in line


# ---------------------------------------------------------------- item 2: --junit replaces only its own report

def test_suite_junit_refuses_to_overwrite_a_record_before_running(run_cli, tmp_path):
    record = write_nccl(tmp_path / "x.json", {1 << 20: 1.0})
    before = record.read_bytes()
    done = run_cli("suite", "--only", "memory", "--junit", str(record), "--results-dir", str(tmp_path / "r"))
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


def test_suite_junit_in_a_directory_that_takes_no_file_is_refused_before_running(run_cli, tmp_path):
    # /proc passes the permission-bit and read-only-mount checks as root, and takes no new file.
    done = run_cli("suite", "--only", "memory", "--junit", "/proc/j.xml", "--results-dir", str(tmp_path / "r"))
    assert done.returncode == 2
    assert "invalid --junit '/proc/j.xml': cannot create a file in '/proc'" in one_error_line(done.stderr)
    assert not (tmp_path / "r").exists()


# ---------------------------------------------------------------- item 3: a results symlink nobody named

def test_a_results_directory_that_is_a_symlink_is_refused_and_a_named_one_followed(run_cli, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "results").symlink_to(elsewhere)
    refused = run_cli("memory", "--sizes", "4K", "--iters", "1", "--warmup", "0")
    assert refused.returncode == 2
    assert (f"results directory 'results' is a symlink to '{elsewhere}'"
            in one_error_line(refused.stderr))
    assert list(elsewhere.iterdir()) == []
    suite = run_cli("suite", "--only", "memory")
    assert suite.returncode == 2 and "is a symlink" in one_error_line(suite.stderr)
    assert list(elsewhere.iterdir()) == []
    # Named by the user: --results-dir through the link, and a --json whose parent is the link.
    named = run_cli("memory", "--sizes", "4K", "--iters", "1", "--warmup", "0", "--results-dir", "results/")
    assert named.returncode == 0, named.stderr
    json_named = run_cli("memory", "--sizes", "4K", "--iters", "1", "--warmup", "0", "--json", "results/m.json")
    assert json_named.returncode == 0, json_named.stderr
    assert len(list(elsewhere.glob("*.json"))) == 2
