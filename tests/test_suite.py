import json
from pathlib import Path

import pytest
from conftest import last_line, symlink_loop
from conftest import refused as _refused

from microbench.accept.suite import headline


def test_headline_names_the_best_bandwidth_per_op_without_ceilings():
    record = {"rows": [
        {"op": "read", "read_gbps": 1.6, "memory_ceiling_gbps": 18.0},
        {"op": "read", "read_gbps": 1.2},
        {"op": "all_gather", "busbw_gbps": 0.5, "algbw_gbps": 1.0},
        {"op": "uni", "bw_gbps": 3.0}]}
    assert headline(record) == "read 1.60 GB/s; all_gather busbw 0.50 GB/s; uni 3.00 GB/s"


def test_a_one_rank_collective_headlines_its_algbw_not_a_zero_busbw():
    """Rows as the suite's nccl step wrote them on one H100 (2026-11-26): one rank moves nothing
    between ranks, so busbw is 0 at every size and the headline falls through to algbw."""
    record = {"kind": "nccl", "rows": [
        {"probe": "nccl", "op": "all_reduce", "size_bytes": 1 << 20, "busbw_gbps": 0.0, "algbw_gbps": 20.0},
        {"probe": "nccl", "op": "all_reduce", "size_bytes": 16 << 20, "busbw_gbps": 0.0, "algbw_gbps": 644.5},
        {"probe": "nccl", "op": "all_gather", "size_bytes": 1 << 20, "busbw_gbps": 0.4, "algbw_gbps": 0.8}]}
    assert headline(record) == "all_reduce algbw 644.50 GB/s at 16M; all_gather busbw 0.40 GB/s at 1M"


# The memory step at a size that takes a moment: these tests are about the suite, not the figures.
SMALL = ("--step-args", "memory=--sizes 16M")


@pytest.mark.slow
def test_suite_runs_a_step_and_gates_it_on_thresholds(run_cli, tmp_path):
    floor = tmp_path / "t.toml"
    floor.write_text('[[check]]\nstep = "memory"\nop = "memcpy_1t"\nmetric = "copy_gbps"\nmin = 0.01\n')
    ok = run_cli("suite", "--only", "memory", *SMALL, "--accept", str(floor), "--results-dir", str(tmp_path / "r"))
    assert ok.returncode == 0, ok.stderr
    assert "PASS" in ok.stdout
    (record_path,) = (tmp_path / "r").glob("suite-*/memory.json")
    assert json.loads(record_path.read_text())["status"] == "complete"

    ceiling = tmp_path / "c.toml"
    ceiling.write_text('[[check]]\nstep = "memory"\nop = "memcpy_1t"\nmetric = "copy_gbps"\nmin = 1e9\n')
    bad = run_cli("suite", "--only", "memory", *SMALL, "--accept", str(ceiling), "--results-dir", str(tmp_path / "r"))
    assert bad.returncode == 1
    assert last_line(bad.stderr) == "microbench: acceptance failed: 1 of 1 check(s) did not pass"


def test_suite_rejects_unknown_steps(cli):
    done = cli("suite", "--only", "gpu")
    assert done.returncode == 2
    assert last_line(done.stderr).startswith("microbench: invalid --only 'gpu': expected some of ")


def test_a_failed_step_shows_its_reason_not_its_headline():
    from microbench.accept.suite import DEFAULT_STEPS, StepResult

    step = DEFAULT_STEPS[1]
    reason = "rank 1 did not answer within 60 s (gloo timeout)"
    failed = StepResult(step, "fail", 61.0, "r.json", "all_gather busbw 0.58 GB/s", reason)
    assert failed.summary() == f"{reason} (partial record: all_gather busbw 0.58 GB/s)"
    assert StepResult(step, "fail", 1.0, None, "", reason).summary() == reason
    assert StepResult(step, "skip", 1.0, None, "", "no GPU").summary() == "no GPU"
    assert StepResult(step, "pass", 9.0, "r.json", "all_gather busbw 0.58 GB/s").summary() == \
        "all_gather busbw 0.58 GB/s"


def test_run_step_reports_the_childs_last_stderr_line_as_the_reason(tmp_path):
    from microbench.accept.suite import run_step
    from microbench.core.registry import SuiteStep as Step

    result = run_step(Step("memory", ("memory", "--sizes", "1Q")), tmp_path, str(tmp_path))
    assert result.status == "fail"
    assert result.summary().startswith("invalid --sizes '1Q'"), result.summary()


@pytest.mark.slow
def test_suite_junit_has_one_testcase_per_check(run_cli, tmp_path):
    import xml.etree.ElementTree as ET

    checks = tmp_path / "t.toml"
    checks.write_text('[[check]]\nstep = "memory"\nop = "memcpy_1t"\nmetric = "copy_gbps"\nmin = 0.01\n'
                      '[[check]]\nstep = "memory"\nop = "memcpy_1t"\nmetric = "copy_gbps"\nmin = 1e9\n'
                      # a GPU copy: an op the step runs where there is a GPU, missing here (GPU hidden)
                      '[[check]]\nstep = "memory"\nop = "h2d"\nmetric = "copy_gbps"\nmin = 1\n')
    report = tmp_path / "junit.xml"
    done = run_cli("suite", "--only", "memory", *SMALL, "--accept", str(checks), "--junit", str(report),
                   "--results-dir", str(tmp_path / "r"))
    assert done.returncode == 1, done.stderr
    root = ET.parse(report).getroot()
    assert root.tag == "testsuites"
    suites = {s.get("name"): s for s in root.findall("testsuite")}
    steps = suites["microbench.suite"]
    assert [c.get("name") for c in steps.findall("testcase")] == ["memory"]
    assert steps.find("testcase/failure") is None
    acc = suites["microbench.accept"]
    cases = acc.findall("testcase")
    assert len(cases) == 3 and acc.get("tests") == "3" and acc.get("failures") == "2"
    assert cases[0].find("failure") is None
    assert cases[1].find("failure").get("type") == "ThresholdNotMet"
    assert "needs >= 1000000000" in cases[1].find("failure").get("message")   # no exponent in a verdict
    assert cases[2].find("failure").get("type") == "MissingResult"
    assert all(c.get("classname") == "microbench.accept.memory" for c in cases)


def test_suite_rejects_an_unwritable_junit_path_before_running(cli, tmp_path):
    done = cli("suite", "--only", "memory", "--junit", str(tmp_path / "no" / "such" / "dir.xml"),
                   "--results-dir", str(tmp_path / "r"))
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1
    assert "invalid --junit" in done.stderr and "does not exist" in done.stderr
    assert not (tmp_path / "r").exists()


def test_suite_steps_spawn_local_ranks_even_inside_a_launchers_world():
    from microbench.accept.suite import step_env
    from microbench.world.launch import detect_world

    srun_task = {"SLURM_PROCID": "1", "SLURM_NTASKS": "4", "SLURM_LOCALID": "0", "SLURM_JOB_ID": "7",
                 "MASTER_ADDR": "node001", "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "4",
                 "RANK": "1", "WORLD_SIZE": "4", "PATH": "/usr/bin"}
    assert detect_world(srun_task) is not None
    child = step_env(srun_task)
    assert detect_world(child) is None
    assert child["SLURM_JOB_ID"] == "7" and child["PATH"] == "/usr/bin" and "PYTHONPATH" in child


@pytest.mark.slow
@pytest.mark.parametrize("signame", ["SIGTERM", "SIGINT"])
def test_a_signal_to_the_suite_pid_ends_its_step_with_a_partial_record(tmp_path, signame):
    import glob
    import signal
    import subprocess
    import sys
    import time

    from conftest import cli_env

    proc = subprocess.Popen([sys.executable, "-m", "microbench", "suite", "--only", "nccl"], cwd=tmp_path,
                            env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def step_running() -> bool:
        for path in glob.glob(str(tmp_path / "results" / "suite-*" / "nccl.json")):
            try:
                data = json.loads(open(path).read())
            except ValueError:
                continue
            return data["status"] == "running" and len(data["rows"]) >= 1
        return False

    try:
        from conftest import wait_for

        wait_for(step_running, proc, "the nccl step measuring")
        proc.send_signal(getattr(signal, signame))   # the suite's PID only, not its process group
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 1, err
    (path,) = glob.glob(str(tmp_path / "results" / "suite-*" / "nccl.json"))
    data = json.loads(open(path).read())
    assert data["status"] == "partial" and "interrupted" in data["status_reason"], data["status_reason"]
    time.sleep(3)   # an orphaned step would still be measuring, and write "complete" later
    assert json.loads(open(path).read()) == data


def _suite_case(tmp_path: Path, read_only_dir: Path, case: str) -> list[str]:
    if case == "path-a-file":
        (tmp_path / "f").write_text("x")
        return ["--path", "f"]
    if case == "path-missing":
        return ["--path", "nowhere"]
    if case == "path-read-only":
        return ["--path", str(read_only_dir)]
    if case == "path-a-loop":
        symlink_loop(tmp_path)
        return ["--path", "loop"]
    if case == "results-dir-a-file":
        (tmp_path / "f").write_text("x")
        return ["--results-dir", "f"]
    return ["--results-dir", str(read_only_dir / "results")]


SUITE_SAYS = {"path-a-file": "--path 'f' is not a directory", "path-missing": "--path 'nowhere' does not exist",
              "path-read-only": "is on a read-only filesystem", "path-a-loop": "--path 'loop' is a symlink loop",
              "results-dir-a-file": "invalid --results-dir 'f': 'f' is a file, not a directory",
              "results-dir-read-only": "is on a read-only filesystem"}


@pytest.mark.root
@pytest.mark.parametrize("case", sorted(SUITE_SAYS))
def test_suite_refuses_its_paths_before_making_a_results_directory(cli, tmp_path, read_only_dir, case):
    argv = _suite_case(tmp_path, read_only_dir, case)
    before = sorted(p.name for p in tmp_path.iterdir())
    _refused(cli("suite", "--only", "memory", *argv, timeout=120), SUITE_SAYS[case])
    assert sorted(p.name for p in tmp_path.iterdir()) == before   # no results/suite-* left behind
    assert list(read_only_dir.iterdir()) == []


def test_a_check_on_an_op_its_step_does_not_run_is_refused_before_any_step(cli, tmp_path):
    checks = tmp_path / "t.toml"
    checks.write_text('[[check]]\nstep = "memory"\nop = "all_reduce"\nmetric = "copy_gbps"\nmin = 0.01\n')
    done = cli("suite", "--only", "memory", "--accept", str(checks), "--results-dir", str(tmp_path / "r"))
    assert done.returncode == 2, done.stderr
    line = last_line(done.stderr)
    assert line.startswith("microbench: the check on step 'memory': op 'all_reduce' is not one the step runs (")
    assert '); e.g. op = "' in line, line   # an op the step runs, for the user to copy
    assert not (tmp_path / "r").exists()


def test_a_check_on_a_step_only_leaves_out_is_refused_before_any_step(cli, tmp_path):
    checks = tmp_path / "t.toml"
    checks.write_text('[[check]]\nstep = "nccl"\nop = "all_reduce"\nmetric = "busbw_gbps"\nmin = 0.01\n')
    done = cli("suite", "--only", "memory", "--accept", str(checks), "--results-dir", str(tmp_path / "r"))
    assert done.returncode == 2, done.stderr
    assert "--only leaves that step out; add it to --only, e.g. --only memory,nccl" in last_line(done.stderr)
    assert not (tmp_path / "r").exists()


@pytest.mark.slow
def test_step_args_come_after_the_steps_own_and_reach_its_record(run_cli, tmp_path):
    done = run_cli("suite", "--only", "memory,storage posix", "--step-args", "memory=--sizes 8M",
                   "--step-args", "storage posix=--size 8M --bs 1M", "--path", str(tmp_path),
                   "--results-dir", str(tmp_path / "r"))
    assert done.returncode == 0, done.stderr
    memory = json.loads(next((tmp_path / "r").glob("suite-*/memory.json")).read_text())
    posix = json.loads(next((tmp_path / "r").glob("suite-*/storage-posix.json")).read_text())
    assert {r["size_bytes"] for r in memory["rows"]} == {8 << 20}          # not the step's 256M
    assert memory["argv"][-4:-2] == ["--sizes", "8M"] and "256M" in memory["argv"]
    assert {r["file_size_bytes"] for r in posix["rows"]} == {8 << 20}       # not the step's 256M file
    assert {r["bs_bytes"] for r in posix["rows"] if r.get("stream") != "single"} == {1 << 20}


STEP_ARGS_SAYS = {
    "no-equals": ("memory", "invalid --step-args 'memory': expected STEP=ARGS (e.g. --step-args 'storage posix=--size 1G')"),
    "not-run": ("nccl=--sizes 1M", "invalid --step-args 'nccl=--sizes 1M': 'nccl' is not a step this suite runs "
                                   "(it runs memory; e.g."),
    "unknown-flag": ("memory=--sizee 8M", "invalid --step-args 'memory=--sizee 8M': unrecognized arguments: --sizee 8M"),
    "bad-value": ("memory=--sizes 8Q", "invalid --step-args 'memory=--sizes 8Q': invalid --sizes '8Q'"),
    "owned-flag": ("memory=--json x.json", "invalid --step-args 'memory=--json x.json': the suite sets --json itself"),
    "unclosed-quote": ("memory=--sizes '8M", "invalid --step-args \"memory=--sizes '8M\": No closing quotation"),
    "help": ("memory=--help", "invalid --step-args 'memory=--help': --help is not a step argument"),
}


@pytest.mark.parametrize("case", sorted(STEP_ARGS_SAYS))
def test_bad_step_args_are_refused_before_any_step(cli, tmp_path, case):
    value, says = STEP_ARGS_SAYS[case]
    _refused(cli("suite", "--only", "memory", "--step-args", value, "--results-dir", str(tmp_path / "r")), says)
    assert not (tmp_path / "r").exists()


def test_step_args_the_probe_itself_refuses_are_refused_before_any_step(cli, tmp_path):
    # Parsed values alone pass; the probe's own check (a block bigger than the file) refuses.
    _refused(cli("suite", "--only", "storage posix", "--step-args", "storage posix=--size 8M --bs 16M",
                 "--results-dir", str(tmp_path / "r")), "invalid --step-args 'storage posix=--size 8M --bs 16M': ")
    assert not (tmp_path / "r").exists()
