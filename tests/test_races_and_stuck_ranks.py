"""Two starts of one thing at once, and a rank that stops: one `lab up` or `mount up` of a name
wins and the other is refused in one line (never both failing, never an internal error); two
suites in one results directory in one second get a directory each; a rank stopped under
dataload's DataLoader ends the run within --timeout plus a few seconds, its workers with it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from conftest import cli_env, descendants, one_error_line, ranks_of, wait_for
from microbench.accept import suite
from microbench.core.claim import exclusive
from microbench.core.errors import UsageError


# --------------------------------------------------------------------------- claims


def test_a_held_claim_refuses_a_second_holder_naming_the_first(tmp_path):
    lock = tmp_path / "locks" / "lab-x"
    with exclusive(lock, "lab 'x' is being created"):
        with pytest.raises(UsageError) as info:
            with exclusive(lock, "lab 'x' is being created"):
                pass
    assert str(info.value) == f"lab 'x' is being created (pid {os.getpid()})"
    with exclusive(lock, "free again"):   # the first let go when its block ended
        pass


def test_two_suites_in_one_second_get_a_directory_each(tmp_path, monkeypatch):
    monkeypatch.setattr(suite.time, "strftime", lambda fmt, t=None: "suite-20260101-000000")
    made: list[str] = []
    errors: list[BaseException] = []

    def one() -> None:
        try:
            made.append(suite.new_suite_dir(tmp_path / "results").name)
        except BaseException as exc:   # noqa: BLE001 - the test reports it
            errors.append(exc)

    threads = [threading.Thread(target=one) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == [] and len(set(made)) == 16
    assert "suite-20260101-000000" in made and "suite-20260101-000000+15" in made


def test_a_suite_directory_taken_between_the_check_and_the_mkdir_goes_to_the_next_name(tmp_path, monkeypatch):
    """Another suite makes the name just before this one does (two started in one second)."""
    monkeypatch.setattr(suite.time, "strftime", lambda fmt, t=None: "suite-20260101-000000")
    real_mkdir = type(tmp_path).mkdir
    taken: list[str] = []

    def mkdir(self, *args, **kwargs):
        if self.name.startswith("suite-") and not taken:
            taken.append(self.name)
            real_mkdir(self, *args, **kwargs)   # the other suite wins the name
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(type(tmp_path), "mkdir", mkdir)
    made = suite.new_suite_dir(tmp_path / "results")
    assert taken == ["suite-20260101-000000"] and made.name == "suite-20260101-000000+1"


def _state_env(tmp_path):
    return {"MICROBENCH_STATE_DIR": str(tmp_path / "state")}


@pytest.mark.slow
@pytest.mark.root
def test_lab_up_while_another_creates_it_is_refused(run_cli, lab_name, tmp_path):
    from microbench.targets.mount.system import state_root

    with exclusive(state_root() / "locks" / f"lab-{lab_name}", "held by the test"):
        done = run_cli("lab", "up", "--name", lab_name, "--hosts", "2", timeout=60)
    assert done.returncode == 2
    assert one_error_line(done.stderr).startswith(f"microbench: lab {lab_name!r} is being created by another "
                                                  f"`microbench lab up --name {lab_name}`")
    assert run_cli("lab", "status", "--name", lab_name).stdout.startswith("no lab named")


@pytest.mark.slow
@pytest.mark.root
def test_two_lab_ups_at_once_leave_one_lab(tmp_path, lab_name):
    argv = [sys.executable, "-m", "microbench", "lab", "up", "--name", lab_name, "--hosts", "2"]
    procs = [subprocess.Popen(argv, cwd=tmp_path, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    done = [(proc.wait(timeout=120), proc.stderr.read()) for proc in procs]
    codes = sorted(code for code, _ in done)
    # Overlapping, the second is refused; one after the other, the second finds the same lab (a no-op).
    assert codes in ([0, 2], [0, 0]), done
    for code, err in done:
        if code == 2:
            assert f"lab {lab_name!r} is being created by another" in one_error_line(err)
    from microbench.lab import namespaces

    lab = namespaces.find(lab_name)
    assert lab is not None and len(lab.hosts) == 2


@pytest.mark.slow
@pytest.mark.root
def test_mount_up_while_another_sets_it_up_is_refused(run_cli, tmp_path):
    env = _state_env(tmp_path)
    with exclusive(tmp_path / "state" / "locks" / "mount-h2race", "held by the test"):
        done = run_cli("mount", "up", "--name", "h2race", env=env, timeout=60)
    if "cannot mount" in done.stderr:
        pytest.skip(done.stderr.strip())
    assert done.returncode == 2
    assert one_error_line(done.stderr).startswith("microbench: mount 'h2race' is being set up by another "
                                                  "`microbench mount up --name h2race`")
    assert not (tmp_path / "state" / "mount-h2race").exists()


@pytest.mark.root
@pytest.mark.slow
def test_two_mount_ups_at_once_leave_one_mount(run_cli, tmp_path):
    env = cli_env(_state_env(tmp_path))
    argv = [sys.executable, "-m", "microbench", "mount", "up", "--name", "h2race"]
    try:
        procs = [subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True) for _ in range(2)]
        done = [(proc.wait(timeout=120), proc.stderr.read()) for proc in procs]
        if any("cannot mount" in err for _, err in done):
            pytest.skip(done[0][1].strip())
        codes = sorted(code for code, _ in done)
        assert codes == [0, 2], done   # one after the other, the second says it is up already (2 as well)
        for code, err in done:
            if code == 2:
                line = one_error_line(err)
                assert "is being set up by another" in line or "is already up" in line, line
        status = run_cli("mount", "status", "--name", "h2race", "--json", env=_state_env(tmp_path))
        assert [row["state"] for row in json.loads(status.stdout)] == ["up"]
    finally:
        run_cli("mount", "down", "--name", "h2race", env=_state_env(tmp_path))


# --------------------------------------------------------------------------- a stopped rank under dataload


@pytest.mark.xdist_group("timed")
@pytest.mark.slow
def test_dataload_with_rank_0_stopped_ends_within_the_timeout_and_its_workers_with_it(tmp_path):
    timeout_s = 6
    proc = subprocess.Popen([sys.executable, "-m", "microbench", "dataload", "--nproc", "2", "--workers", "2",
                             "--samples", "2000", "--decode-us", "2000", "--iters", "50", "--warmup", "0",
                             "--timeout", str(timeout_s), "--path", str(tmp_path)],
                            cwd=tmp_path, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # Both ranks inside a pass: each has its two DataLoader workers.
    wait_for(lambda: len(ranks_of(proc.pid)) == 2 and all(len(descendants(pid)) >= 2
                                                           for pid in ranks_of(proc.pid).values()), proc,
             "two ranks with their DataLoader workers")
    everything = descendants(proc.pid)
    rank0 = ranks_of(proc.pid)[0]
    os.kill(rank0, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        # With a worker left behind holding the pipes, communicate() would wait for ever.
        _, err = proc.communicate(timeout=60)
    finally:
        for pid in everything:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    took = time.monotonic() - stopped
    assert proc.returncode == 1
    line = one_error_line(err)
    # Said by the supervisor, or by rank 1 when its pass reached a collective first.
    assert ("rank 0 stopped (SIGSTOP or a debugger) for more than --timeout 6 s" in line
            or "rank 0 died or stopped responding" in line), line
    # --timeout, the supervisor's 3 s for a peer to say it first, its poll: not a whole case of passes.
    assert took < timeout_s + 8, f"{took:.1f} s"
    time.sleep(1)   # the kernel's parent-death signals
    left = [pid for pid in everything if os.path.exists(f"/proc/{pid}")
            and open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"]
    assert left == []
