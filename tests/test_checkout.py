"""The checkout itself: what git keeps and what it leaves out."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)


@pytest.fixture
def git_checkout():
    if shutil.which("git") is None or _git("rev-parse", "--is-inside-work-tree").returncode != 0:
        pytest.skip("not a git checkout (an sdist or an installed copy): nothing to check")


@pytest.mark.parametrize("path", ["results/suite-20261122-022305/collectives.json", "results/nccl-20261122-1.json",
                                  "results/nccl.csv", "results/plot.png"])
def test_runs_under_results_are_ignored(git_checkout, path):
    # --no-index: answer from the ignore rules alone, whether or not such a file was ever committed.
    assert _git("check-ignore", "-q", "--no-index", path).returncode == 0, f"{path} is not ignored by git"


def test_results_readme_is_kept(git_checkout):
    assert _git("check-ignore", "-q", "--no-index", "results/README.md").returncode == 1
    assert _git("ls-files", "--error-unmatch", "results/README.md").returncode == 0


def test_no_run_is_committed(git_checkout):
    tracked = [p for p in _git("ls-files", "results").stdout.split() if p != "results/README.md"]
    assert tracked == [], f"records committed under results/: {tracked}"
