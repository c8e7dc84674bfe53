import os

import pytest

from microbench.targets import native
from microbench.targets.fallback import memcpy_run


def test_native_module_is_built_where_ci_expects_it():
    if os.environ.get("MICROBENCH_EXPECT_NATIVE") != "1":
        pytest.skip("MICROBENCH_EXPECT_NATIVE is not set (only .ci/run requires the compiled core)")
    assert native.available(), native.implementation()["fallback_reason"]
    assert native.implementation()["name"] == "native"


def test_memcpy_native_and_fallback_agree_on_shape():
    size = 4 << 20
    fallback = memcpy_run(size, 2, 3)
    assert len(fallback) == 3 and all(t > 0 for t in fallback)
    if native.available():
        times = native.memcpy_bandwidth(size, 2, 3)
        assert len(times) == 3 and all(t > 0 for t in times)


@pytest.mark.slow
def test_forced_fallback_is_reported(run_cli):
    done = run_cli("env", "--json", env={"MICROBENCH_NO_NATIVE": "1"})
    assert done.returncode == 0, done.stderr
    import json

    impl = json.loads(done.stdout)["implementation"]
    assert impl == {"native": False, "name": "python", "fallback_reason": "MICROBENCH_NO_NATIVE is set"}
