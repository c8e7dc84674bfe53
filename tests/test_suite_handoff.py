"""What `microbench suite` hands its steps so they skip repeated work."""

from __future__ import annotations

import json
import subprocess
import sys

from microbench import env
from microbench.dist import package_env


def test_torch_facts_handed_down_by_the_suite():
    # A fresh interpreter: the hand-off is only consulted where torch is not imported yet.
    code = "import json, microbench.env as e; print(json.dumps(e.torch_info()))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env=package_env({**dict(__import__("os").environ),
                                           env.TORCH_INFO_ENV: '{"torch": "9.9", "gpus": []}'}))
    info = json.loads(done.stdout)
    assert info["torch"] == "9.9" and "suite" in info["torch_info_source"]


def test_suite_hands_real_torch_facts():
    handed = json.loads(env.torch_info_for_children()[env.TORCH_INFO_ENV])
    assert "torch" in handed and "gpus" in handed
