"""Distributed worlds: join one a launcher made, or launch local ranks ourselves.

One code path for every launcher: with no world in the environment, `launch_local` re-runs the
same command line N times with torchrun-style variables (RANK, WORLD_SIZE, MASTER_ADDR, ...),
optionally prefixed per rank (e.g. `ip netns exec HOST` for the lab). Every rank then joins
through `World.join`, exactly as under torchrun, srun or mpirun.

Failure handling is the point of this module: a peer that dies, an unreachable master or a taken
port must end the run within --timeout with a message naming the cause, never hang.

The split with session.py: this module is the mechanics of a world and stays free of policy (it
is given a backend and a device, never chooses them, and knows no command); session.py decides,
for a command, how many ranks, which device and backend, and runs the command's body in the
world this module builds. supervise.py watches the local ranks this module launches.
"""

from __future__ import annotations

import datetime as _dt
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ..core.errors import RunError, UsageError
from .supervisor import Supervisor, check_local_world

# Short enough that a few beats (the settle in missing_ranks) add about a second to --timeout.
HEARTBEAT_S = 0.25
SPAWNED_ENV = "MICROBENCH_SPAWNED"
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
        raise UsageError(f"launched by {launcher} but MASTER_ADDR is not set: export the first host's "
                         f"address, e.g. MASTER_ADDR=node001 MASTER_PORT=29500")
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


def launch_local(nproc: int, argv: Sequence[str], *, timeout_s: float, master_addr: str = "127.0.0.1",
                 master_port: int | None = None, per_rank: Callable[[int], RankLaunch] | None = None,
                 extra_env: dict[str, str] | None = None) -> int:
    """Run `python -m microbench ARGV` as ranks 0..nproc-1 and return the exit code to use.

    Rank 0's output goes straight to our stdout/stderr (only rank 0 prints). Other ranks'
    stderr is kept in a file and shown, one line, only if they fail while rank 0 did not.
    The first SIGINT or SIGTERM is forwarded once, as SIGINT, so rank 0 can write its partial
    record; later ones are only counted (a scheduler's Ctrl-C then SIGTERM must not kill the
    ranks mid-save). If rank 0 is killed or freezes, the record it claimed is marked partial here.
    """
    from . import interrupts, fork as prefork
    from ..results.store import RECORD_NOTE_ENV

    check_local_world(nproc)
    interrupts.check()
    port = master_port or free_port(master_addr if master_addr.startswith("127.") else "0.0.0.0")
    base_env = package_env()
    base_env.update(extra_env or {})
    note_fd, note = tempfile.mkstemp(prefix="microbench-record-", suffix=".txt")
    os.close(note_fd)
    base_env[RECORD_NOTE_ENV] = note
    procs: list[Any] = []  # Popen, or prefork.Forked
    logs: list[Any] = []
    signals: list[int] = []
    with interrupts.handled(lambda signum, frame: signals.append(signum)):
        try:
            for rank in range(nproc):
                launch = per_rank(rank) if per_rank else RankLaunch()
                env = dict(base_env, RANK=str(rank), WORLD_SIZE=str(nproc), LOCAL_RANK=str(rank),
                           LOCAL_WORLD_SIZE=str(nproc), MASTER_ADDR=master_addr, MASTER_PORT=str(port),
                           **{SPAWNED_ENV: "1"}, **launch.env)
                log = None if rank == 0 else tempfile.TemporaryFile(mode="w+")
                logs.append(log)
                stdout, stderr = (None, None) if rank == 0 else (subprocess.DEVNULL, log)
                # Own session: a terminal's Ctrl-C reaches only us, and we forward it once, so a
                # rank never gets a second SIGINT while it saves its partial record.
                if prefork.ready() and not launch.prefix:  # a warm suite step: fork, no imports
                    procs.append(prefork.start(argv, env, stdout=stdout, stderr=stderr, new_session=True))
                    continue
                procs.append(subprocess.Popen(
                    [*launch.prefix, *self_command(), *argv], env=env, stdout=stdout, stderr=stderr,
                    stdin=subprocess.DEVNULL, start_new_session=True))
            return Supervisor(procs, logs, timeout_s, signals, note).run()
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


# --------------------------------------------------------------------------- joining


class World:
    """A joined process group plus a gloo control group for small metadata exchanges.

    The data backend (nccl or gloo) carries the measured traffic; timings, counts and error
    notes travel over gloo so that they never need device buffers.
    """

    def __init__(self, spec: WorldSpec, backend: str, timeout_s: float, device: str = "cpu"):
        import torch.distributed as dist

        self.spec, self.backend, self.timeout_s, self.device = spec, backend, timeout_s, device
        self.rank, self.size = spec.rank, spec.size
        self._dist = dist
        self._stop = threading.Event()
        timeout = _dt.timedelta(seconds=timeout_s)
        self.store = _make_store(spec, timeout_s)
        try:
            dist.init_process_group(backend, store=self.store, rank=spec.rank, world_size=spec.size, timeout=timeout,
                                    **({"device_id": _torch_device(device)} if device.startswith("cuda") else {}))
            self.control = dist.new_group(backend="gloo", timeout=timeout) if backend != "gloo" else None
        except Exception as exc:
            raise RunError(f"rank {spec.rank} could not join the {backend} world at "
                           f"{spec.master_addr}:{spec.master_port} within {timeout_s:g} s: {_first_line(exc)}") from None
        self._heartbeat = threading.Thread(target=self._beat, name="microbench-heartbeat", daemon=True)
        self._heartbeat.start()

    # Small exchanges over the control group ------------------------------------------
    def all_gather_object(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self.size
        self._dist.all_gather_object(out, obj, group=self.control)
        return out

    def broadcast_object(self, obj: Any) -> Any:
        box = [obj]
        self._dist.broadcast_object_list(box, src=0, group=self.control)
        return box[0]

    def barrier(self) -> None:
        self._dist.barrier(group=self.control)

    # Failure diagnosis -----------------------------------------------------------------
    def _beat(self) -> None:
        # A counter in the store, not a timestamp: hosts' clocks need not agree.
        while not self._stop.wait(HEARTBEAT_S):
            try:
                self.store.add(f"mb/hb/{self.rank}", 1)
            except Exception:
                return

    def note_failure(self, reason: str) -> bool:
        """Tell the others this rank saw an error and is leaving on its own (not dead). The store
        lives in rank 0: if rank 0 froze, this must not wait for it. False if the store did not
        take the note."""
        try:
            bounded(lambda: self.store.set(f"mb/left/{self.rank}", reason[:200]), STORE_OP_S)
            return True
        except Exception:
            return False

    def missing_ranks(self, settle_s: float = 4 * HEARTBEAT_S) -> list[int]:
        """Ranks that died without a word: no departure note and a heartbeat that stood still.

        Called by a rank that saw a collective fail. Reads every heartbeat counter, waits
        settle_s (several beats, and time for peers that merely saw the same failure to leave
        their note), and reads again.
        """
        others = [r for r in range(self.size) if r != self.rank]

        def read() -> dict[int, tuple[bool, int]]:
            return {r: (self.store.check([f"mb/left/{r}"]), self.store.add(f"mb/hb/{r}", 0)) for r in others}

        try:
            before = bounded(read, STORE_OP_S)
            time.sleep(settle_s)
            after = bounded(read, STORE_OP_S)
            return [r for r in others if not after[r][0] and after[r][1] == before[r][1]]
        except Exception:
            # The store lives in rank 0; if it does not answer, rank 0 is the one gone (or frozen).
            return [0] if self.rank != 0 else []

    def own_link_down(self) -> str | None:
        """This rank's network interface, if it is down: 'lab0 is lowerlayerdown'. Then peers look
        silent because this rank is cut off, and the blame is this rank's. The interface is the
        one the backends were told to use (GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME), else the
        route to the master; None when unknown or up."""
        names = os.environ.get("GLOO_SOCKET_IFNAME") or os.environ.get("NCCL_SOCKET_IFNAME") or \
            _route_ifname(self.spec.master_addr)
        for name in (names or "").split(","):
            name = name.strip()
            if not name or name == "lo":
                continue
            try:
                with open(f"/sys/class/net/{name}/operstate") as handle:
                    state = handle.read().strip()
            except OSError:
                continue
            if state not in ("up", "unknown"):
                return f"{name} is {state}"
        return None

    def close(self, failed: bool = False) -> None:
        """Leave the world. After a failure the process is about to exit anyway, and tearing the
        group down would wait on the peer that failed: skipped."""
        self._stop.set()
        if failed:
            return
        try:
            if self._dist.is_initialized():
                # Tearing down may talk to a peer or the store that is gone: never wait long.
                bounded(self._dist.destroy_process_group, STORE_OP_S)
        except Exception:
            pass


# One store read or write takes microseconds; this long without an answer means the store's
# host (rank 0) is frozen or unreachable.
STORE_OP_S = 1.0


def bounded(fn: Callable[[], Any], seconds: float) -> Any:
    """fn() in a helper thread; TimeoutError if it has not returned within `seconds`. For C++
    calls (TCPStore) that ignore their own timeout when the peer accepted but never answers; a
    call that never returns is left behind in its daemon thread."""
    box: dict[str, Any] = {}

    def call() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # handed back to the caller below
            box["error"] = exc

    thread = threading.Thread(target=call, name="microbench-bounded", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise TimeoutError(f"no answer within {seconds:g} s")
    if "error" in box:
        raise box["error"]
    return box.get("value")


def _route_ifname(addr: str) -> str | None:
    try:
        out = subprocess.run(["ip", "-o", "route", "get", socket.gethostbyname(addr)], capture_output=True,
                             text=True, timeout=2).stdout.split()
    except (OSError, subprocess.SubprocessError, socket.error):
        return None
    return out[out.index("dev") + 1] if "dev" in out[:-1] else None


def _torch_device(device: str) -> Any:
    """The rank's own device for init_process_group(device_id=...): torch refuses one without an
    index ("Please use a device_id with index.", distributed_c10d.py), so "cuda" alone is a bug
    of the caller (session.in_world passes "cuda:<local index>")."""
    import torch

    dev = torch.device(device)
    if dev.type != "cpu" and dev.index is None:
        raise RunError(f"device {device!r} has no index: a rank joins with its own GPU, e.g. 'cuda:0'")
    return dev


def _make_store(spec: WorldSpec, timeout_s: float) -> Any:
    from torch.distributed import TCPStore

    deadline = time.monotonic() + timeout_s
    if spec.rank != 0:
        # TCPStore retries a refused connect with back-off for up to about twice its timeout;
        # polling the port ourselves keeps "master unreachable" within --timeout.
        wait_for_master(spec.master_addr, spec.master_port, timeout_s, rank=spec.rank)
    remaining = max(1.0, deadline - time.monotonic())
    try:
        # The client's handshake waits forever on a master that accepted and never answers (a
        # frozen rank 0, a wrong MASTER_PORT): bounded by what is left of --timeout.
        return bounded(lambda: TCPStore(spec.master_addr, spec.master_port, spec.size, spec.rank == 0,
                                        timeout=_dt.timedelta(seconds=remaining), wait_for_workers=False,
                                        use_libuv=True), remaining)
    except TimeoutError:
        raise RunError(f"rank {spec.rank}: the master at {spec.master_addr}:{spec.master_port} accepted the "
                       f"connection but did not answer within {timeout_s:g} s (--timeout); is rank 0 frozen, or "
                       f"is MASTER_PORT another program's port?") from None
    except Exception as exc:
        text = _first_line(exc)
        if spec.rank == 0 and ("in use" in text.lower() or "EADDRINUSE" in text):
            raise RunError(f"MASTER_PORT {spec.master_port} on {spec.master_addr} is already in use; "
                           f"choose a free port, e.g. MASTER_PORT={free_port()}") from None
        if spec.rank == 0:
            raise RunError(f"rank 0 could not listen on {spec.master_addr}:{spec.master_port}: {text}") from None
        raise RunError(f"rank {spec.rank} could not reach the master at {spec.master_addr}:{spec.master_port} "
                       f"within {timeout_s:g} s (--timeout): {text}") from None


def wait_for_master(addr: str, port: int, timeout_s: float, *, rank: int) -> None:
    """Return once something accepts connections on addr:port; RunError after timeout_s."""
    deadline = time.monotonic() + timeout_s
    try:
        infos = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise RunError(f"MASTER_ADDR {addr!r} does not resolve ({exc.strerror}); set it to rank 0's "
                       f"host name or IP address, e.g. MASTER_ADDR=127.0.0.1") from None
    last = "no answer"
    while True:
        for family, kind, proto, _, sockaddr in infos:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RunError(f"rank {rank} could not reach the master at {addr}:{port} within "
                               f"{timeout_s:g} s (--timeout): {last}; is rank 0 running and MASTER_ADDR/"
                               f"MASTER_PORT right?")
            with socket.socket(family, kind, proto) as sock:
                sock.settimeout(min(remaining, 2.0))
                try:
                    sock.connect(sockaddr)
                    return
                except OSError as exc:
                    last = (exc.strerror or str(exc) or type(exc).__name__).lower()
        time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__
