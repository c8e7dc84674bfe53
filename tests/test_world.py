"""Which world a launcher set up, read from its environment variables."""

import os
import signal
import socket
import time

import pytest
from conftest import join_nccl, one_error_line, ranks_of, records, start_nccl_sweep

from microbench.core.errors import RunError, UsageError
from microbench.run.runner import SweepSettings, _iterations
from microbench.world.dist import wait_for_master
from microbench.world.launch import WorldSpec, detect_world, first_slurm_host

MASTER = {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29512"}


def test_no_launcher_means_no_world():
    assert detect_world({}) is None
    assert detect_world({"SLURM_PROCID": "0", "SLURM_NTASKS": "1"}) is None  # one task: not a world


def test_torchrun():
    env = {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", **MASTER}
    assert detect_world(env) == WorldSpec(3, 8, 1, "10.0.0.1", 29512, "torchrun")


def test_our_own_spawned_ranks_say_local():
    env = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MICROBENCH_SPAWNED": "1", **MASTER}
    assert detect_world(env).launcher == "local"


def test_slurm_with_master_addr():
    env = {"SLURM_PROCID": "5", "SLURM_NTASKS": "16", "SLURM_LOCALID": "1", **MASTER}
    assert detect_world(env) == WorldSpec(5, 16, 1, "10.0.0.1", 29512, "slurm")


def test_slurm_without_master_addr_uses_the_first_node(monkeypatch):
    # No scontrol on a test machine: the hostlist is expanded by our own parser.
    monkeypatch.setenv("PATH", "/nonexistent")
    env = {"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_LOCALID": "0", "SLURM_JOB_NODELIST": "gpu[007-008]"}
    spec = detect_world(env)
    assert (spec.master_addr, spec.master_port, spec.launcher) == ("gpu007", 29500, "slurm")


@pytest.mark.parametrize("nodelist, first", [
    ("gpu[007-010,12],cpu1", "gpu007"), ("node1,node2", "node1"), ("n[5]", "n5"), ("rack[2-3]-a", "rack2-a"),
])
def test_first_slurm_host(nodelist, first):
    assert first_slurm_host(nodelist) == first


def test_open_mpi_and_mpich():
    ompi = {"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "0", **MASTER}
    assert detect_world(ompi) == WorldSpec(2, 4, 0, "10.0.0.1", 29512, "mpi")
    mpich = {"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1", **MASTER}
    assert detect_world(mpich) == WorldSpec(1, 2, 1, "10.0.0.1", 29512, "mpi")


def test_torchrun_variables_win_over_slurm_ones():
    env = {"RANK": "1", "WORLD_SIZE": "2", "SLURM_PROCID": "0", "SLURM_NTASKS": "8", **MASTER}
    assert detect_world(env).launcher == "torchrun"


@pytest.mark.parametrize("env, fragment", [
    ({"RANK": "one", "WORLD_SIZE": "2", **MASTER}, "RANK='one'"),
    ({"RANK": "2", "WORLD_SIZE": "2", **MASTER}, "rank 2 is outside a world of size 2"),
    ({"RANK": "0", "WORLD_SIZE": "2"}, "MASTER_ADDR is not set"),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "70000"}, "MASTER_PORT 70000"),
])
def test_broken_launcher_environments_are_misuse(env, fragment):
    with pytest.raises(UsageError) as info:
        detect_world(env)
    assert fragment in str(info.value)


def test_waiting_for_a_master_that_is_not_there_ends_at_the_timeout():
    with socket.socket() as sock:  # a port nobody listens on: bound, never listening
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        with pytest.raises(RunError) as info:
            wait_for_master("127.0.0.1", port, 0.5, rank=1)
    assert f"rank 1 could not reach the master at 127.0.0.1:{port} within 0.5 s (--timeout)" in str(info.value)


def test_waiting_for_a_listening_master_returns():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        wait_for_master("127.0.0.1", sock.getsockname()[1], 5, rank=1)


def test_an_unresolvable_master_is_named():
    with pytest.raises(RunError, match="MASTER_ADDR 'no-such-host.invalid' does not resolve"):
        wait_for_master("no-such-host.invalid", 29500, 5, rank=1)


@pytest.mark.parametrize("warm, want", [([1e-4], 20), ([0.5, 0.4], 5), ([10.0], 3), ([], 20)])
def test_iterations_fit_the_budget_but_never_drop_below_the_minimum(warm, want):
    assert _iterations(SweepSettings(iters=20, budget_s_per_case=2.0, min_iters=3), warm) == want


def test_a_rank_reads_the_notes_its_peers_left_when_they_failed():
    """A rank whose collective broke learns what its peers' own errors were (their departure notes)."""
    from torch.distributed import HashStore

    from microbench.world.dist import World

    world = World.__new__(World)   # the store is all peer_notes reads
    world.rank, world.size, world.store = 0, 3, HashStore()
    assert world.peer_notes() == {}
    world.store.set("mb/left/2", "CheckpointException: rank 2 could not write step-4")
    world.store.set("mb/left/0", "Connection closed by peer")   # this rank's own note is not a peer's
    assert world.peer_notes() == {2: "CheckpointException: rank 2 could not write step-4"}


def test_local_world_limit_rule(monkeypatch):
    from microbench.world import supervisor as dist

    monkeypatch.setattr(dist.os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(dist, "_mem_available_bytes", lambda: 64 << 30)
    limit, rule = dist.local_world_limit()
    assert (limit, rule) == (16, "8 per CPU core x 2 core(s)")
    monkeypatch.setattr(dist, "_mem_available_bytes", lambda: 1 << 30)
    assert dist.local_world_limit() == (4, "1.0 GiB available / 256 MiB per rank")


@pytest.mark.parametrize("command", [["nccl", "--sizes", "1M"], ["checkpoint", "--size", "1G", "--target", "ck"],
                                     ["verify", "fsdp"]])
def test_too_many_local_ranks_are_refused_before_any_starts(cli, tmp_path, command):
    from microbench.world.supervisor import local_world_limit

    limit, rule = local_world_limit()
    proc = cli(*command, "--nproc", "1000", "--timeout", "5", timeout=60)
    assert proc.returncode == 2
    line = one_error_line(proc.stderr)
    assert f"invalid --nproc 1000: this machine runs at most {limit} local ranks ({rule})" in line
    assert f"--nproc {limit} or fewer" in line and "torchrun/srun/mpirun" in line
    assert proc.stdout == "" and not (tmp_path / "results").exists() and not (tmp_path / "ck").exists()


@pytest.mark.slow
def test_a_launched_world_is_not_bounded(run_cli):
    import socket

    with socket.socket() as sock:  # bound, never listening: the master is absent
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        proc, _ = join_nccl(run_cli, 999, port, world=1000, timeout="2")
    assert proc.returncode == 1  # it tried to join: the launcher's world, not ours to refuse
    assert "rank 999 could not reach the master" in one_error_line(proc.stderr)


class MutePort(int):
    """A port number that also keeps when (time.monotonic) each connection was accepted."""

    accepted_at: list[float]


@pytest.fixture
def mute_master():
    """A TCP port that accepts connections and never says a word."""
    import socket
    import threading

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    accepted = []
    stop = threading.Event()

    def serve():
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                accepted.append(server.accept()[0])
                port.accepted_at.append(time.monotonic())
            except OSError:
                continue

    port = MutePort(server.getsockname()[1])
    port.accepted_at = []
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield port
    stop.set()
    thread.join()
    for conn in accepted:
        conn.close()
    server.close()


@pytest.mark.xdist_group("timed")
@pytest.mark.slow
def test_a_master_that_accepts_and_never_answers(run_cli, mute_master):
    proc, _ = join_nccl(run_cli, 1, mute_master)
    ended = time.monotonic()
    assert proc.returncode == 1
    line = one_error_line(proc.stderr)
    assert f"the master at 127.0.0.1:{mute_master} accepted the connection but did not answer within 5 s" in line
    # Timed from the connection, not from the start: interpreter and torch start-up on a busy
    # machine took up to 22 s before it (four test workers on two cores).
    waited = ended - mute_master.accepted_at[0]
    assert waited < 5 + 5, waited  # --timeout, then the one line and the exit


@pytest.mark.xdist_group("timed")
@pytest.mark.slow
@pytest.mark.parametrize("frozen", [0, 1])
def test_a_frozen_rank_ends_the_run_within_the_timeout(tmp_path, frozen):
    proc = start_nccl_sweep(tmp_path)
    ranks = ranks_of(proc.pid)
    os.kill(ranks[frozen], signal.SIGSTOP)
    stopped_at = time.monotonic()
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        for pid in ranks.values():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    elapsed = time.monotonic() - stopped_at
    assert proc.returncode == 1
    line = one_error_line(err)
    assert f"rank {frozen} died or stopped responding during all_reduce" in line
    assert elapsed < 5 + 2.5, elapsed  # --timeout 5, a second of heartbeats, the exit: not ~6 s more
    (record,) = records(tmp_path)
    assert record["status"] == "partial" and f"rank {frozen}" in record["status_reason"]
    assert len(record["rows"]) >= 2 and "(partial)" in line
