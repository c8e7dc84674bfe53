"""Misuse that a hostile run found accepted, or found only after the work (or as a crash): each
is refused before any work, exit 2 and one stderr line naming the value as typed, nothing
written. Then the exit-code rule (found before work: 2; during: 1) for read-only targets, one
grammar for every --timeout, and the native copy that crashed when its threads could not start."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap

import pytest

from conftest import cli_env, refused as _refused
from microbench.core.errors import UsageError
from microbench.core.units import parse_timeout
from microbench.probes.memory import usable_cores


CORES = usable_cores()
BUCKET_RULE = "expected an S3 bucket name: 3-63 of a-z, 0-9, '.' and '-', a letter or digit at each end"
BEFORE_WORK = [
    ("memory-threads", ["memory", "--threads", "100000"],
     f"invalid --threads 100000: this machine has {CORES} usable core(s); use --threads {CORES} or fewer"),
    ("memory-sizes-1T", ["memory", "--sizes", "1T"], "invalid --sizes: a 1T copy reads one buffer and writes another"),
    ("s3-concurrency", ["storage", "s3", "--concurrency", "100000"],
     "invalid --concurrency 100000: at most 1024 requests in flight"),
    ("s3-bucket-upper", ["storage", "s3", "--bucket", "UPPER"], f"invalid --bucket 'UPPER': {BUCKET_RULE}"),
    ("s3-bucket-short", ["storage", "s3", "--bucket", "a"], f"invalid --bucket 'a': {BUCKET_RULE}"),
    ("s3-bucket-empty", ["storage", "s3", "--bucket", ""], f"invalid --bucket '': {BUCKET_RULE}"),
    ("s3-bucket-dots", ["storage", "s3", "--bucket", "my..bucket"], "invalid --bucket 'my..bucket': an S3 bucket name has no '..'"),
    ("target-bucket-upper", ["checkpoint", "--target", "s3://UPPER/x", "--size", "1M"],
     f"invalid --target 's3://UPPER/x': {BUCKET_RULE}"),
    ("modelload-target-bucket", ["modelload", "--target", "s3://a/x"], f"invalid --target 's3://a/x': {BUCKET_RULE}"),
    ("compute-model-and-config", ["compute", "--model", "mistral-7b", "--model-config", "config.json"],
     "--model 'mistral-7b' and --model-config 'config.json' both name the model to time; give one"),
    ("compute-tokens", ["compute", "--tokens", "100000000"], "invalid --tokens 100000000: the head matmul"),
    ("dataload-samples", ["dataload", "--samples", "1000000000000"],
     "not enough free space for 1000000000000 samples"),
    ("mount-status-never", ["mount", "status", "--name", "neverexisted"],
     "no mount named 'neverexisted' on this machine (none is up or left over)"),
    ("mount-up-path", ["mount", "up", "--name", "h2path", "--path", "/nonexistent-microbench/mnt"],
     "mount point '/nonexistent-microbench/mnt': directory '/nonexistent-microbench' does not exist"),
    ("modelload-timeout", ["modelload", "--timeout", "1e300"], "invalid --timeout '1e300': must be at most 86400"),
    ("dataload-timeout", ["dataload", "--timeout", "8x"],
     "invalid --timeout '8x': expected seconds, or a duration with a unit"),
]


@pytest.fixture
def no_mount_left(cli):
    """Where a build accepts the misuse (the bug these tests catch), the mount it made goes."""
    yield
    for name in ("h2ro", "h2path", "h2t"):
        cli("mount", "down", "--name", name, timeout=60)


@pytest.mark.xdist_group("serial")
@pytest.mark.parametrize("argv,fragment", [c[1:] for c in BEFORE_WORK], ids=[c[0] for c in BEFORE_WORK])
@pytest.mark.usefixtures("no_mount_left")
def test_misuse_is_refused_before_any_work(cli, tmp_path, argv, fragment):
    _refused(cli(*argv, timeout=120), fragment)
    assert list(tmp_path.iterdir()) == []   # no results directory, no record, no dataset


def test_dataload_refuses_a_dataset_too_big_before_planning_it(monkeypatch, tmp_path):
    """The plan takes time in proportion to the samples (a trillion: minutes): the space check
    that refuses them comes first."""
    from microbench.probes import dataload
    from microbench.probes.dataload import dataset

    def never(*args, **kwargs):
        raise AssertionError("planned before refusing")

    monkeypatch.setattr(dataset, "plan_for", never)
    with pytest.raises(UsageError, match="not enough free space for 1000000000000 samples"):
        dataload.validate(dataload.Config(samples=10 ** 12, path=str(tmp_path)))


@pytest.mark.slow
def test_an_aws_profile_the_config_lacks_is_refused_for_every_s3_path(cli, tmp_path):
    env = {"AWS_PROFILE": "nosuchprofile", "AWS_CONFIG_FILE": str(tmp_path / "none"),
           "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none")}
    for argv in (["storage", "s3"], ["modelload", "--target", "s3://microbench/m", "--size", "4M"],
                 ["dataload", "--target", "s3://microbench/d", "--samples", "16"],
                 ["checkpoint", "--target", "s3://microbench/c", "--size", "1M"]):
        _refused(cli(*argv, env=env, timeout=120),
                 "AWS profile 'nosuchprofile' not found in the AWS config files")
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------- one --timeout grammar


@pytest.mark.parametrize("text,seconds", [("8", 8.0), ("8s", 8.0), ("500ms", 0.5), ("2min", 120.0), ("1h", 3600.0),
                                          ("0.5", 0.5), ("86400", 86400.0)])
def test_every_timeout_takes_seconds_bare_or_with_a_unit(text, seconds):
    assert parse_timeout(text) == seconds


@pytest.mark.parametrize("text,why", [("0", "must be more than 0"), ("-1s", "must be more than 0"),
                                      ("25h", "must be at most 86400 s (one day)"), ("nan", "expected a finite number"),
                                      ("8x", "expected seconds, or a duration with a unit")])
def test_a_bad_timeout_is_refused_quoting_it(text, why):
    with pytest.raises(UsageError, match=re.escape(f"invalid --timeout '{text}': {why}")):
        parse_timeout(text)


@pytest.mark.slow
@pytest.mark.usefixtures("no_mount_left")
def test_mount_up_takes_a_bare_timeout(run_cli, tmp_path):
    # Refused for its --path (checked after the flags), not for '--timeout 8' lacking a unit.
    _refused(run_cli("mount", "up", "--name", "h2t", "--timeout", "8", "--path", "/nonexistent-microbench/m"),
             "mount point '/nonexistent-microbench/m'")


# --------------------------------------------------------------------------- read-only targets: exit 2 before work


@pytest.mark.slow
@pytest.mark.root
@pytest.mark.parametrize("argv", [
    ["mount", "up", "--name", "h2ro", "--cache-dir", "{ro}"],
    ["storage", "mount", "--cache-dir", "{ro}"],
    ["mount", "up", "--name", "h2ro", "--cache-dir", "{ro}/sub"],
], ids=["mount-up", "storage-mount", "mount-up-below"])
@pytest.mark.usefixtures("no_mount_left")
def test_a_read_only_cache_dir_is_refused(run_cli, read_only_dir, argv):
    argv = [a.replace("{ro}", str(read_only_dir)) for a in argv]
    _refused(run_cli(*argv, timeout=120), f"invalid --cache-dir {argv[-1]!r}: directory {str(read_only_dir)!r} is on "
                                          f"a read-only filesystem")
    assert list(read_only_dir.iterdir()) == []


@pytest.mark.slow
@pytest.mark.root
@pytest.mark.parametrize("argv,flag", [
    (["dataload", "--path", "{ro}", "--samples", "16"], "--path"),
    (["modelload", "--target", "{ro}", "--size", "4M"], "--target"),
    (["storage", "posix", "--path", "{ro}", "--size", "8M", "--bs", "1M"], "--path"),
], ids=["dataload", "modelload", "storage-posix"])
def test_a_read_only_target_is_exit_2_before_work(run_cli, tmp_path, read_only_dir, argv, flag):
    argv = [a.replace("{ro}", str(read_only_dir)) for a in argv]
    _refused(run_cli(*argv, timeout=120), f"{flag} {str(read_only_dir)!r}: directory {str(read_only_dir)!r} is on a "
                                          f"read-only filesystem")
    assert not (tmp_path / "results").exists()


# --------------------------------------------------------------------------- the native copy's threads


@pytest.mark.slow
@pytest.mark.root
def test_memcpy_whose_threads_cannot_start_fails_with_eagain_and_lives_on(tmp_path):
    """Under a process limit a few threads start and the rest cannot: the started ones once
    waited on a barrier on the returned call's stack, detached (a later SIGSEGV)."""
    from microbench.targets import native

    if not native.available():
        pytest.skip("the native core is not built")
    script = textwrap.dedent("""
        import os, resource, time
        from microbench.targets import native
        assert native.available()
        os.setgid(65534); os.setuid(65534)   # root ignores RLIMIT_NPROC
        resource.setrlimit(resource.RLIMIT_NPROC, (40, 40))
        for _ in range(5):
            try:
                native.memcpy_run(1 << 20, 400, 2)
            except OSError as exc:
                assert exc.errno == 11, exc
        time.sleep(0.5)
        print(native.memcpy_run(1 << 20, 2, 2)[1])
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=cli_env(), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, (done.returncode, done.stderr)
    assert done.stdout.strip() in ("libc", "stream")
