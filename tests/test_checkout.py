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


# --------------------------------------------------------------------------- run from a checkout

import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402

import microbench  # noqa: E402
from microbench import native  # noqa: E402
from microbench.dist import package_env, self_command  # noqa: E402

PKG = Path(microbench.__file__).resolve().parent


def _checkout_copy(where: Path) -> Path:
    """A checkout as a user has it before building: the sources, no compiled core."""
    shutil.copytree(PKG, where / "microbench", ignore=shutil.ignore_patterns("_native*", "__pycache__"))
    (where / "CMakeLists.txt").write_text("# stands for the project's build file\n")
    return where


@pytest.mark.parametrize("safe_path_flag", [True, False], ids=["dash-P", "pop-cwd"])
def test_a_child_imports_the_launchers_package_not_the_working_directorys(tmp_path, safe_path_flag):
    if safe_path_flag and sys.version_info < (3, 11):
        pytest.skip("-P needs Python 3.11")
    checkout = _checkout_copy(tmp_path)
    code = "import microbench; print(microbench.__file__)"
    done = subprocess.run(self_command(code, safe_path_flag=safe_path_flag), cwd=checkout, env=package_env(),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()).resolve().parent == PKG
    module = subprocess.run([*self_command(safe_path_flag=safe_path_flag), "--version"], cwd=checkout,
                            env=package_env(), capture_output=True, text=True, timeout=60)
    assert module.returncode == 0 and module.stdout.startswith("microbench "), module.stderr


def _launcher(tmp_path: Path) -> list[str]:
    """What the `microbench` console script does: its own directory, not the working one, is
    sys.path[0], so the launcher imports the package under test."""
    script = tmp_path / "bin" / "microbench"
    script.parent.mkdir()
    script.write_text("import sys\nfrom microbench.cli import main\nsys.exit(main())\n")
    return [sys.executable, str(script)]


@pytest.mark.slow
def test_the_suite_from_a_checkout_measures_with_the_installed_native_core(tmp_path):
    if not native.available():
        pytest.skip(f"the package under test has no native core: {native.implementation()['fallback_reason']}")
    checkout = _checkout_copy(tmp_path / "checkout")
    env = {k: v for k, v in package_env().items() if k not in ("RANK", "WORLD_SIZE", "MICROBENCH_NO_NATIVE")}
    done = subprocess.run([*_launcher(tmp_path), "suite", "--only", "memory,collectives",
                           "--results-dir", str(tmp_path / "r")], cwd=checkout, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "WARNING" not in done.stderr
    records = sorted((tmp_path / "r").glob("suite-*/*.json"))
    assert [p.name for p in records] == ["collectives.json", "memory.json"]
    for path in records:
        assert json.loads(path.read_text())["implementation"]["name"] == "native", path


def test_a_missing_native_core_is_the_first_line_of_the_output(tmp_path):
    checkout = _checkout_copy(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MICROBENCH_NO_NATIVE")}
    argv = [sys.executable, "-m", "microbench", "memory", "--sizes", "64K", "--iters", "2", "--warmup", "0"]
    done = subprocess.run([*argv, "--json", "a.json"], cwd=checkout, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    first = done.stderr.splitlines()[0]
    assert first.startswith("microbench: WARNING: the native core is missing from ") and "checkout" in first
    assert json.loads((checkout / "a.json").read_text())["implementation"]["name"] == "python"

    asked = subprocess.run([*argv, "--json", "b.json"], cwd=checkout, env=dict(env, MICROBENCH_NO_NATIVE="1"),
                           capture_output=True, text=True, timeout=120)
    assert asked.returncode == 0 and "WARNING" not in asked.stderr, asked.stderr
