"""world/stacks.py: a local rank's Python stacks on the launcher's request, kept in the record
when the launcher has to end that rank (a peer failed, and this one did not end by itself)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from conftest import cli_env, ranks_of, records, start_nccl_sweep, wait_for

pytestmark = pytest.mark.slow


def test_an_armed_rank_writes_every_threads_python_stack_on_request(tmp_path):
    from microbench.world import stacks

    child = textwrap.dedent("""
        import threading, time
        from microbench.world import stacks
        stacks.arm()

        def a_helper_thread_waiting():
            time.sleep(60)

        def the_main_thread_waiting_here():
            print("armed", flush=True)
            time.sleep(60)

        threading.Thread(target=a_helper_thread_waiting, daemon=True).start()
        the_main_thread_waiting_here()
    """)
    env = dict(cli_env(), **{stacks.DIR_ENV: str(tmp_path), "RANK": "3"})
    proc = subprocess.Popen([sys.executable, "-c", child], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "armed"
        got = stacks.ask([(3, proc)], str(tmp_path))
        assert proc.poll() is None                  # asked, not ended: ending it is the caller's
    finally:
        proc.kill()
        proc.wait()
    assert set(got) == {3}
    assert "the_main_thread_waiting_here" in got[3] and "a_helper_thread_waiting" in got[3], got[3]
    # A rank that has already ended is not asked, and has nothing to say.
    assert stacks.ask([(3, proc)], str(tmp_path / "none")) == {}


def test_a_rank_still_waiting_when_rank_0_failed_leaves_its_stacks_in_rank_0s_record(tmp_path):
    # As in a verify job seen once in CI: rank 0 failed with its own line (a collective timed out
    # on rank 1), and rank 1, busy elsewhere, was ended by the launcher. Real processes, the real
    # supervisor; rank 0 is a stand-in that writes its partial record, names it, and fails.
    from microbench.world import stacks
    from microbench.world.supervisor import Supervisor

    record, note = tmp_path / "r.json", tmp_path / "note.txt"
    record.write_text(json.dumps({"schema_version": 1, "kind": "job", "status": "partial", "rows": []}))
    note.write_text(f"{record}\n")
    rank1 = textwrap.dedent("""
        import time
        from microbench.world import stacks
        stacks.arm()

        def reading_a_batch_that_never_comes():
            print("armed", flush=True)
            time.sleep(120)

        reading_a_batch_that_never_comes()
    """)
    env = dict(cli_env(), **{stacks.DIR_ENV: str(tmp_path)})
    waiting = subprocess.Popen([sys.executable, "-c", rank1], env=dict(env, RANK="1"), stdout=subprocess.PIPE, text=True)
    assert waiting.stdout.readline().strip() == "armed"
    failing = subprocess.Popen([sys.executable, "-c", "raise SystemExit(1)"], env=dict(env, RANK="0"))
    try:
        code = Supervisor([failing, waiting], [None, None], 30.0, [], str(note), str(tmp_path)).run()
    finally:
        waiting.kill()
        waiting.wait()
    assert code == 1 and waiting.returncode == -signal.SIGKILL
    kept = json.loads(record.read_text())
    assert kept["status"] == "partial"                          # rank 0's own account stands
    (ended,) = kept["ended_ranks"]
    assert ended["rank"] == 1 and ended["why"] == "did not end within 0.5 s of another rank's failure"
    assert "reading_a_batch_that_never_comes" in ended["python_stacks"], ended


def test_a_frozen_rank_is_not_asked(tmp_path, monkeypatch):
    # A stopped process runs no handler: asking it would only delay the end by stacks.WAIT_S.
    from microbench.world import stacks
    from microbench.world.supervisor import Supervisor

    asked: list[list[int]] = []
    monkeypatch.setattr(stacks, "ask", lambda procs, directory: asked.append([r for r, _ in procs]) or {})
    note = tmp_path / "note.txt"
    note.write_text("")
    frozen = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    os.kill(frozen.pid, signal.SIGSTOP)
    failing = subprocess.Popen([sys.executable, "-c", "raise SystemExit(1)"])
    try:
        code = Supervisor([failing, frozen], [None, None], 30.0, [], str(note), str(tmp_path)).run()
    finally:
        frozen.kill()
        frozen.wait()
    assert code == 1 and frozen.returncode == -signal.SIGKILL
    assert asked == [[]]  # the supervisor ended the world once, and asked no one


def test_the_launchers_ranks_are_armed_and_go_on_after_a_dump(tmp_path):
    proc = start_nccl_sweep(tmp_path, timeout="30")
    try:
        rank1 = ranks_of(proc.pid)[1]
        with open(f"/proc/{rank1}/environ", "rb") as handle:
            env = dict(item.split(b"=", 1) for item in handle.read().split(b"\0") if b"=" in item)
        directory = env[b"MICROBENCH_STACKS_DIR"].decode()
        os.kill(rank1, signal.SIGUSR1)
        wait_for(lambda: "(most recent call first)" in _read(f"{directory}/rank1.txt"), proc, "rank 1's stacks", 30)
        assert "microbench/" in _read(f"{directory}/rank1.txt")
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err                  # the dump did not disturb the sweep
    (record,) = records(tmp_path)
    assert record["status"] == "complete" and "ended_ranks" not in record
    assert not os.path.exists(directory)              # the launcher's directory removed with the world


def _read(path: str) -> str:
    try:
        with open(path) as handle:
            return handle.read()
    except OSError:
        return ""
