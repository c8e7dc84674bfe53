"""Launchers: a world a launcher made (torchrun, srun, mpirun: its variables), or local ranks we
launch ourselves.

One code path for every launcher: with no world in the environment, `launch_local` re-runs the
same command line N times with torchrun-style variables (RANK, WORLD_SIZE, MASTER_ADDR, ...),
optionally prefixed per rank (e.g. `ip netns exec HOST` for the lab). Every rank then joins
through world/dist.py's World, exactly as under torchrun, srun or mpirun; world/supervisor.py
watches the local ranks launched here.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ..core.errors import UsageError
from .supervisor import Supervisor, check_local_world

SPAWNED_ENV = "MICROBENCH_SPAWNED"
# Ranks launched on this machine: on a lab with several ranks per host LOCAL_WORLD_SIZE is the
# emulated node's, while cores and memory are shared by every rank here.
MACHINE_RANKS_ENV = "MICROBENCH_MACHINE_RANKS"
# A launcher's rank variables: only the process where all of them are unset or 0 prints and writes.
RANK_VARIABLES = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK")


@dataclass(frozen=True)
class WorldSpec:
    rank: int
    size: int
    local_rank: int
    master_addr: str
    master_port: int
    launcher: str  # torchrun | slurm | mpi | local


def _int_env(env: dict[str, str], *names: str) -> int | None:
    for name in names:
        if env.get(name, "").strip():
            try:
                return int(env[name])
            except ValueError:
                raise UsageError(f"environment variable {name}={env[name]!r} is not an integer") from None
    return None


def detect_world(env: dict[str, str] | None = None) -> WorldSpec | None:
    """Read the world a launcher set up, or None when this process is on its own.

    torchrun/local: RANK, WORLD_SIZE, LOCAL_RANK. Slurm: SLURM_PROCID, SLURM_NTASKS,
    SLURM_LOCALID. Open MPI: OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK; MPICH and Intel MPI:
    PMI_RANK/PMI_SIZE, MPI_LOCALRANKID. MASTER_ADDR/MASTER_PORT are required except under
    Slurm, where the first node of the job is used.
    """
    env = dict(os.environ if env is None else env)
    if env.get("WORLD_SIZE") and env.get("RANK"):
        launcher = "local" if env.get(SPAWNED_ENV) else "torchrun"
        rank, size, local = _int_env(env, "RANK"), _int_env(env, "WORLD_SIZE"), _int_env(env, "LOCAL_RANK")
    elif env.get("SLURM_PROCID") and env.get("SLURM_NTASKS") and _int_env(env, "SLURM_NTASKS") != 1:
        launcher = "slurm"
        rank, size, local = _int_env(env, "SLURM_PROCID"), _int_env(env, "SLURM_NTASKS"), _int_env(env, "SLURM_LOCALID")
    elif env.get("OMPI_COMM_WORLD_RANK") and env.get("OMPI_COMM_WORLD_SIZE"):
        launcher = "mpi"
        rank = _int_env(env, "OMPI_COMM_WORLD_RANK")
        size = _int_env(env, "OMPI_COMM_WORLD_SIZE")
        local = _int_env(env, "OMPI_COMM_WORLD_LOCAL_RANK")
    elif env.get("PMI_RANK") and env.get("PMI_SIZE"):
        launcher = "mpi"
        rank, size, local = _int_env(env, "PMI_RANK"), _int_env(env, "PMI_SIZE"), _int_env(env, "MPI_LOCALRANKID")
    else:
        return None
    assert rank is not None and size is not None
    if size < 1 or not 0 <= rank < size:
        raise UsageError(f"rank {rank} is outside a world of size {size}: check the launcher's environment")
    addr = env.get("MASTER_ADDR") or (_slurm_first_node(env) if launcher == "slurm" else None)
    if not addr:
        raise UsageError(
            f"launched by {launcher} but MASTER_ADDR is not set: export the first host's "
            f"address, e.g. MASTER_ADDR=node001 MASTER_PORT=29500"
        )
    port = _int_env(env, "MASTER_PORT") or 29500
    if not 0 < port < 65536:
        raise UsageError(f"MASTER_PORT {port} is not a TCP port: expected 1-65535, e.g. MASTER_PORT=29500")
    return WorldSpec(rank, size, local or 0, addr, port, launcher)


def _slurm_first_node(env: dict[str, str]) -> str | None:
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not nodelist:
        return None
    try:
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, timeout=10)
        first = out.stdout.split()
        if out.returncode == 0 and first:
            return first[0]
    except (OSError, subprocess.SubprocessError):
        pass
    return first_slurm_host(nodelist)


def first_slurm_host(nodelist: str) -> str | None:
    """First host of a Slurm hostlist without scontrol: 'gpu[007-010,12],cpu1' -> 'gpu007'."""
    head = nodelist.strip()
    match = re.match(r"^([^\[,]*)\[([^\]]*)\]([^,\[]*)", head)
    if match:
        prefix, ranges, suffix = match.groups()
        return f"{prefix}{ranges.split(',')[0].split('-')[0]}{suffix}"
    return head.split(",")[0] or None


def package_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for a child Python process that must import this same microbench (a
    checkout or the installed one): its parent directory goes first on PYTHONPATH."""
    env = dict(os.environ if base is None else base)
    pkg_parent = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # microbench/world/..
    env["PYTHONPATH"] = os.pathsep.join(p for p in (pkg_parent, env.get("PYTHONPATH", "")) if p)
    return env


def self_command(code: str | None = None, *, safe_path_flag: bool = sys.version_info >= (3, 11)) -> list[str]:
    """argv that starts a child Python on this very microbench (give it package_env()):
    `python -m microbench`, or `python -c CODE`. Both would put the working directory first on
    sys.path; run from a checkout, that directory's microbench (no compiled core) would shadow
    the installed package the launcher runs, and every rank would silently measure the Python
    fallback. `-P` (3.11+) leaves the working directory out; before 3.11 the child drops it."""
    if safe_path_flag:
        return [sys.executable, "-P", *(("-c", code) if code else ("-m", "microbench"))]
    body = code or "import runpy; runpy.run_module('microbench', run_name='__main__', alter_sys=True)"
    # `-c` always puts '' (the working directory) at sys.path[0] before 3.11.
    return [sys.executable, "-c", f"import sys; sys.path.pop(0)\n{body}"]


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


# --------------------------------------------------------------------------- launching


@dataclass
class RankLaunch:
    """How to start one local rank: a command prefix (e.g. ip netns exec) and extra env."""

    prefix: Sequence[str] = ()
    env: dict[str, str] = field(default_factory=dict)


def launch_local(
    nproc: int,
    argv: Sequence[str],
    *,
    timeout_s: float,
    master_addr: str = "127.0.0.1",
    master_port: int | None = None,
    per_rank: Callable[[int], RankLaunch] | None = None,
    extra_env: dict[str, str] | None = None,
) -> int:
    """Run `python -m microbench ARGV` as ranks 0..nproc-1 and return the exit code to use.

    Rank 0's output goes straight to our stdout/stderr (only rank 0 prints). Other ranks'
    stderr is kept in a file and shown, one line, only if they fail while rank 0 did not.
    The first SIGINT or SIGTERM is forwarded once, as SIGINT, so rank 0 can write its partial
    record; later ones are only counted (a scheduler's Ctrl-C then SIGTERM must not kill the
    ranks mid-save). If rank 0 is killed or freezes, the record it claimed is marked partial here.
    """
    from ..results.store import RECORD_NOTE_ENV
    from . import fork as prefork, interrupts, stacks

    check_local_world(nproc)
    interrupts.check()
    port = master_port or free_port(master_addr if master_addr.startswith("127.") else "0.0.0.0")
    base_env = package_env()
    base_env.update(extra_env or {})
    note_fd, note = tempfile.mkstemp(prefix="microbench-record-", suffix=".txt")
    os.close(note_fd)
    base_env[RECORD_NOTE_ENV] = note
    stacks_dir = tempfile.mkdtemp(prefix="microbench-stacks-")
    base_env[stacks.DIR_ENV] = stacks_dir
    procs: list[Any] = []  # Popen, or prefork.Forked
    logs: list[Any] = []
    signals: list[int] = []
    with interrupts.handled(lambda signum, frame: signals.append(signum)):
        try:
            for rank in range(nproc):
                launch = per_rank(rank) if per_rank else RankLaunch()
                env = dict(
                    base_env,
                    RANK=str(rank),
                    WORLD_SIZE=str(nproc),
                    LOCAL_RANK=str(rank),
                    LOCAL_WORLD_SIZE=str(nproc),
                    MASTER_ADDR=master_addr,
                    MASTER_PORT=str(port),
                    **{SPAWNED_ENV: "1", MACHINE_RANKS_ENV: str(nproc)},
                )
                # A placement may say otherwise (a lab host's own LOCAL_RANK and LOCAL_WORLD_SIZE).
                env.update(launch.env)
                log = None if rank == 0 else tempfile.TemporaryFile(mode="w+")
                logs.append(log)
                stdout, stderr = (None, None) if rank == 0 else (subprocess.DEVNULL, log)
                # Own session: a terminal's Ctrl-C reaches only us, and we forward it once, so a
                # rank never gets a second SIGINT while it saves its partial record.
                if prefork.ready() and not launch.prefix:  # a warm suite step: fork, no imports
                    procs.append(prefork.start(argv, env, stdout=stdout, stderr=stderr, new_session=True))
                    continue
                procs.append(
                    subprocess.Popen(
                        [*launch.prefix, *self_command(), *argv],
                        env=env,
                        stdout=stdout,
                        stderr=stderr,
                        stdin=subprocess.DEVNULL,
                        start_new_session=True,
                    )
                )
            return Supervisor(procs, logs, timeout_s, signals, note, stacks_dir).run()
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            for log in logs:
                if log:
                    log.close()
            try:
                os.unlink(note)
            except OSError:
                pass
            shutil.rmtree(stacks_dir, ignore_errors=True)
