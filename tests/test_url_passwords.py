"""A password in an --endpoint URL is hidden whatever is wrong with the URL: one the parser reads
as a host and a bad port (`http://bob:SECRET/z@host`: an unencoded '/'), a bad port after a
password, a port out of range. Each is refused with exit 2 and one line that never shows it."""

from __future__ import annotations

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
