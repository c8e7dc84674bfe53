"""What `microbench suite` hands its steps so they skip repeated work."""

from __future__ import annotations

import pytest


def test_torch_facts_handed_down_by_the_suite(monkeypatch):
    import sys

    from microbench import env

    if "torch" in sys.modules:
        pytest.skip("torch already imported in this process: the hand-off is not consulted")
    monkeypatch.setenv(env.TORCH_INFO_ENV, '{"torch": "9.9", "gpus": []}')
    info = env.torch_info()
    assert info["torch"] == "9.9" and "suite" in info["torch_info_source"]
