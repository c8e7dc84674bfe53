"""`mount down --name X` stops only X's rclone processes: not those of another mount whose name
starts with X (a `vjob` down once matched `vjob-1a2b3c4d`'s state directory as a prefix of its
path, and a running `verify job`'s mount would have lost its daemon)."""

from __future__ import annotations

import subprocess
import sys

from microbench.targets import mount as mountmod
from microbench.targets.mount import system as sysm


def _fake_rclone(path: str) -> subprocess.Popen:
    """A process whose argv[0] is `rclone` and whose command line names `path`, as `mount up`'s
    server and daemon name their files under the mount's state directory."""
    return subprocess.Popen(["rclone", "-c", "import time; time.sleep(120)", "--log-file", path],
                            executable=sys.executable)


def test_down_leaves_a_mount_whose_name_only_starts_with_the_name(tmp_path, monkeypatch):
    monkeypatch.setenv(sysm.STATE_ENV, str(tmp_path / "state"))
    other = _fake_rclone(str(mountmod.state_dir("vjob-1a2b3c4d") / "mount.log"))
    try:
        removed = mountmod.down("vjob")
        assert other.poll() is None and not any("rclone pid" in r for r in removed), removed
        removed = mountmod.down("vjob-1a2b3c4d")
        assert f"rclone pid {other.pid}" in removed
        assert other.wait(timeout=10) is not None
    finally:
        other.kill()
        other.wait()
