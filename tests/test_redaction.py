"""A password in an --endpoint URL is hidden whatever is wrong with the URL: one the parser reads
as a host and a bad port (`http://bob:SECRET/z@host`: an unencoded '/'), a bad port after a
password, a port out of range. Each is refused with exit 2 and one line that never shows it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import cli_env, one_error_line

from microbench.core.redaction import redact_text
from microbench.targets.s3client import public_url

PW = "S3CRETPW"


@pytest.mark.parametrize("url, shown", [
    (f"http://bob:{PW}/z@127.0.0.1:39999", "http://bob:<redacted>@127.0.0.1:39999"),
    (f"http://bob:{PW}@127.0.0.1:9000", "http://bob:<redacted>@127.0.0.1:9000"),
    (f"http://bob:a@{PW}@h:1/p", "http://bob:<redacted>@h:1/p"),
    (f"s3://k:{PW}?x#y@bucket/key", "s3://k:<redacted>@bucket/key"),
    ("http://127.0.0.1:9000/a", "http://127.0.0.1:9000/a"),
])
def test_redact_text_hides_every_password_the_parser_might_not_see(url, shown):
    assert redact_text(f"invalid --endpoint {url!r}: bad port") == f"invalid --endpoint {shown!r}: bad port"


@pytest.mark.parametrize("url", [f"http://bob:{PW}@127.0.0.1:xx", f"http://bob:{PW}@127.0.0.1:3999999",
                                 f"http://bob:{PW}/z@127.0.0.1:39999"])
def test_public_url_never_raises_and_never_shows_the_password(url):
    assert PW not in public_url(url)


def _cli(cwd, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "microbench", *args], env=cli_env(), capture_output=True, text=True,
                          timeout=120, cwd=cwd)


@pytest.mark.slow
@pytest.mark.parametrize("command", [("storage", "s3"), ("checkpoint", "--target", "s3://bucket/x"),
                                     ("modelload", "--target", "s3://bucket/x"), ("dataload", "--path", "s3://bucket/x")])
@pytest.mark.parametrize("url, fragment", [
    (f"http://bob:{PW}/z@127.0.0.1:39999", "invalid --endpoint 'http://bob:<redacted>@127.0.0.1:39999': the "
                                           "user:password before '@' holds a '/', '?' or '#'"),
    (f"http://bob:{PW}@127.0.0.1:xx", "invalid --endpoint 'http://127.0.0.1:xx': bad port (a number from 1 to 65535)"),
    (f"http://bob:{PW}@127.0.0.1:3999999", "invalid --endpoint 'http://127.0.0.1:3999999': bad port"),
], ids=["slash-in-password", "port-not-a-number", "port-out-of-range"])
def test_a_rejected_endpoint_is_quoted_without_its_password(command, url, fragment, tmp_path):
    done = _cli(tmp_path, *command, "--endpoint", url, "--bucket" if command[0] == "storage" else "--timeout",
                "bucket" if command[0] == "storage" else "5")
    assert done.returncode == 2, done.stdout + done.stderr
    line = one_error_line(done.stderr)
    assert fragment in line, line
    assert PW not in done.stdout + done.stderr
    assert list(tmp_path.iterdir()) == []   # refused before any work


URL = f"http://u:{PW}@127.0.0.1:1"


@pytest.mark.parametrize("failure", [
    # botocore's own text, as a library exception the runner diagnoses
    OSError(f'Could not connect to the endpoint URL: "{URL}/b/obj"'),
    # one of ours, quoting the endpoint as given
    __import__("microbench.core.errors", fromlist=["RunError"]).RunError(f"failed listing bucket at {URL}: x"),
])
def test_a_url_password_in_any_failure_reaches_neither_the_record_nor_the_message(tmp_path, failure):
    from test_results_store import FailingProbe

    from microbench.run.runner import SweepSettings, run_probe

    settings = SweepSettings(warmup=1, iters=2, budget_s_per_case=None, progress=False)
    with pytest.raises(Exception) as info:
        run_probe(FailingProbe(failure), settings, config={}, results_dir=str(tmp_path))
    (path,) = tmp_path.glob("*.json")
    record = json.loads(path.read_text())
    assert record["status"] == "partial" and "u:<redacted>@127.0.0.1:1" in record["status_reason"]
    assert PW not in path.read_text()
    assert PW not in str(info.value) and "u:<redacted>@" in str(info.value)


@pytest.mark.slow
def test_storage_s3_and_checkpoint_on_a_closed_port_never_print_the_password(run_cli):
    env = {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"}
    s3 = run_cli("storage", "s3", "--endpoint", URL, "--bucket", "bkt", env=env, timeout=120)
    assert s3.returncode == 1 and "Could not connect to the endpoint URL" in s3.stderr  # botocore's quoted URL
    ck = run_cli("checkpoint", "--target", "s3://bkt/p", "--endpoint", URL, env=env, timeout=120)
    assert ck.returncode == 1 and "cannot reach the S3 endpoint" in ck.stderr
    for done in (s3, ck):
        line = one_error_line(done.stderr)
        assert PW not in done.stderr + done.stdout and "u:<redacted>@127.0.0.1:1" in line
