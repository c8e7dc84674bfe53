"""stdout that goes away or takes nothing. Its reader leaving (`| head -1`) ends every command
quietly with 141, the SIGPIPE convention the README promises, its record kept and never left
"running"; a stdout closed from the start (`>&-`) or on a full device (/dev/full) is one line and
exit 1, never an internal error. Two output flags naming one file are refused before the work."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import cli_env, head_1, one_error_line

# Each long enough to print a few lines after its first: the reader leaves in the middle.
PIPED = {
    "memory": ["memory", "--sizes", "64K-1M", "--threads", "1", "--warmup", "0", "--iters", "2"],
    "nccl": ["nccl", "--sizes", "64K-256K", "--nproc", "2", "--ops", "all_reduce", "--warmup", "0", "--iters", "2"],
    "link": ["link", "--sizes", "64K-256K", "--lat-sizes", "64", "--warmup", "0", "--iters", "2"],
    "storage-posix": ["storage", "posix", "--size", "8M", "--bs", "1M", "--warmup", "0", "--iters", "2"],
    "checkpoint": ["checkpoint", "--size", "1M", "--nproc", "2", "--warmup", "0", "--iters", "2"],
    "dataload": ["dataload", "--samples", "64", "--warmup", "0", "--iters", "2"],
    "compute": ["compute", "--warmup", "0", "--iters", "2"],
}


def _argv(name: str, tmp_path: Path) -> list[str]:
    argv = list(PIPED[name])
    if name == "storage-posix":
        argv += ["--path", str(tmp_path)]
    if name == "checkpoint":
        argv += ["--target", str(tmp_path / "ck")]
    return argv


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(PIPED))
def test_piped_into_head_1_exit_141_quietly_and_no_record_left_running(tmp_path, name):
    code, first, err = head_1(_argv(name, tmp_path), tmp_path)
    assert first and code == 141 and err == "", (code, first, err)
    for path in (tmp_path / "results").glob("*.json"):
        record = json.loads(path.read_text())
        assert record["status"] in ("complete", "partial"), record["status"]
        if record["status"] == "partial":
            assert record["status_reason"].startswith("stdout closed by its reader")


def _closed_stdout(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "microbench", *argv], cwd=cwd, env=cli_env(), stderr=subprocess.PIPE,
                          text=True, timeout=180, preexec_fn=lambda: os.close(1))


def _to_dev_full(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    with open("/dev/full", "w") as full:
        return subprocess.run([sys.executable, "-m", "microbench", *argv], cwd=cwd, env=cli_env(), stdout=full,
                              stderr=subprocess.PIPE, text=True, timeout=180)


GPU = ["--gpu", "h100", "--nodes", "1", "--gpus-per-node", "2"]
QUICK = {
    "compose": ["compose", "--model", "llama-3.1-8b", "--net", "ib=40GB/s", *GPU],
    "memory": ["memory", "--sizes", "64K", "--threads", "1", "--warmup", "0", "--iters", "2"],
    "nccl": ["nccl", "--sizes", "64K", "--nproc", "2", "--ops", "all_reduce", "--warmup", "0", "--iters", "2"],
    "env": ["env"],
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(QUICK))
def test_started_with_stdout_closed_exit_1_one_line_before_any_work(tmp_path, name):
    done = _closed_stdout(QUICK[name], tmp_path)
    assert done.returncode == 1, done.stderr
    assert one_error_line(done.stderr).startswith("microbench: stdout is closed (started with >&-)")
    assert not (tmp_path / "results").exists()


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(QUICK))
def test_stdout_on_dev_full_exit_1_one_line(tmp_path, name):
    done = _to_dev_full(QUICK[name], tmp_path)
    assert done.returncode == 1, done.stderr
    assert one_error_line(done.stderr).startswith("microbench: cannot write to stdout: No space left on device")
    for path in (tmp_path / "results").glob("*.json"):
        assert json.loads(path.read_text())["status"] != "running"


@pytest.mark.parametrize("argv,line", [
    (["nccl", "--sizes", "64K", "--json", "x", "--csv", "x"],
     "microbench: invalid --csv 'x': the same file as --json 'x'; each output needs a file of its own, e.g. --csv x.csv"),
    (["memory", "--sizes", "64K", "--json", "r.json", "--csv", "./r.json"],
     "microbench: invalid --csv './r.json': the same file as --json 'r.json'; each output needs a file of its own, "
     "e.g. --csv r.csv"),
    (["hunt", "--lab", "nosuchlab", "--json", "h.json", "--heatmap", "h.json"],
     "microbench: invalid --heatmap 'h.json': the same file as --json 'h.json'; each output needs a file of its "
     "own, e.g. --heatmap h.png"),
])
def test_two_outputs_naming_one_file_are_refused_before_the_work(cli, tmp_path, argv, line):
    done = cli(*argv, timeout=60)
    assert done.returncode == 2 and one_error_line(done.stderr) == line
    assert list(tmp_path.iterdir()) == []


def _with_closed_stdout(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """`microbench ARGV | head -0`, deterministically: the pipe's reader is gone before the first write."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run([sys.executable, "-m", "microbench", *argv], cwd=cwd, env=cli_env(), stdout=write_end,
                              stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write_end)


@pytest.mark.slow
def test_compose_into_a_closed_pipe_ends_quietly(tmp_path):
    done = _with_closed_stdout(["compose", "--model", "llama-3.1-8b", "--net", "ib=40GB/s", *GPU], tmp_path)
    assert done.stderr == "" and done.returncode == 141


@pytest.mark.slow
@pytest.mark.root
def test_lab_shape_into_a_closed_pipe_ends_quietly(lab, tmp_path):
    done = _with_closed_stdout(["lab", "shape", "--name", lab.name, "--link", "100mbit"], tmp_path)
    assert done.stderr == "" and done.returncode == 141
