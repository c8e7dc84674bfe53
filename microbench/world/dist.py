"""Distributed worlds: join one (the process group, a gloo control group, heartbeats) with
bounded waits.

Failure handling is the point of this module: a peer that dies, an unreachable master or a taken
port must end the run within --timeout with a message naming the cause, never hang.

The split: world/launch.py reads a launcher's variables and launches local ranks; this module
joins the world they describe. Both are mechanics, free of policy (given a backend and a device,
never choosing them, and knowing no command); world/policy.py decides, for a command, how many
ranks, which device and backend, and runs the command's body in the world built here.
"""

from __future__ import annotations

import datetime as _dt
import os
import socket
import subprocess
import threading
import time
from typing import Any, Callable

from ..core.errors import RunError
from . import interrupts
from .launch import WorldSpec, free_port

# Short enough that a few beats (the settle in missing_ranks) add about a second to --timeout.
HEARTBEAT_S = 0.25


# --------------------------------------------------------------------------- joining


class World:
    """A joined process group plus a gloo control group for small metadata exchanges.

    The data backend (nccl or gloo) carries the measured traffic; timings, counts and error
    notes travel over gloo so that they never need device buffers.
    """

    def __init__(self, spec: WorldSpec, backend: str, timeout_s: float, device: str = "cpu"):
        with interrupts.deferred():  # a rank's first torch import: see deferred()
            import torch.distributed as dist

        self.spec, self.backend, self.timeout_s, self.device = spec, backend, timeout_s, device
        self.rank, self.size = spec.rank, spec.size
        self._dist = dist
        self._stop = threading.Event()
        timeout = _dt.timedelta(seconds=timeout_s)
        self.store = _make_store(spec, timeout_s)
        try:
            dist.init_process_group(
                backend,
                store=self.store,
                rank=spec.rank,
                world_size=spec.size,
                timeout=timeout,
                **({"device_id": _torch_device(device)} if device.startswith("cuda") else {}),
            )
            self.control = dist.new_group(backend="gloo", timeout=timeout) if backend != "gloo" else None
        except Exception as exc:
            raise RunError(
                f"rank {spec.rank} could not join the {backend} world at "
                f"{spec.master_addr}:{spec.master_port} within {timeout_s:g} s: {_first_line(exc)}"
            ) from None
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

    def peer_notes(self) -> dict[int, str]:
        """The departure notes other ranks left (note_failure): each one's own error, which a
        rank that only saw its collective break cannot know. Empty when the store does not answer."""
        others = [r for r in range(self.size) if r != self.rank]

        def read() -> dict[int, str]:
            return {
                r: self.store.get(f"mb/left/{r}").decode(errors="replace")
                for r in others
                if self.store.check([f"mb/left/{r}"])
            }

        try:
            return bounded(read, STORE_OP_S)
        except Exception:
            return {}

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
        names = (
            os.environ.get("GLOO_SOCKET_IFNAME")
            or os.environ.get("NCCL_SOCKET_IFNAME")
            or _route_ifname(self.spec.master_addr)
        )
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
        out = subprocess.run(
            ["ip", "-o", "route", "get", socket.gethostbyname(addr)], capture_output=True, text=True, timeout=2
        ).stdout.split()
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
        return bounded(
            lambda: TCPStore(
                spec.master_addr,
                spec.master_port,
                spec.size,
                spec.rank == 0,
                timeout=_dt.timedelta(seconds=remaining),
                wait_for_workers=False,
                use_libuv=True,
            ),
            remaining,
        )
    except TimeoutError:
        raise RunError(
            f"rank {spec.rank}: the master at {spec.master_addr}:{spec.master_port} accepted the "
            f"connection but did not answer within {timeout_s:g} s (--timeout); is rank 0 frozen, or "
            f"is MASTER_PORT another program's port?"
        ) from None
    except Exception as exc:
        text = _first_line(exc)
        if spec.rank == 0 and ("in use" in text.lower() or "EADDRINUSE" in text):
            raise RunError(
                f"MASTER_PORT {spec.master_port} on {spec.master_addr} is already in use; "
                f"choose a free port, e.g. MASTER_PORT={free_port()}"
            ) from None
        if spec.rank == 0:
            raise RunError(f"rank 0 could not listen on {spec.master_addr}:{spec.master_port}: {text}") from None
        raise RunError(
            f"rank {spec.rank} could not reach the master at {spec.master_addr}:{spec.master_port} "
            f"within {timeout_s:g} s (--timeout): {text}"
        ) from None


def wait_for_master(addr: str, port: int, timeout_s: float, *, rank: int) -> None:
    """Return once something accepts connections on addr:port; RunError after timeout_s."""
    deadline = time.monotonic() + timeout_s
    try:
        infos = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise RunError(
            f"MASTER_ADDR {addr!r} does not resolve ({exc.strerror}); set it to rank 0's "
            f"host name or IP address, e.g. MASTER_ADDR=127.0.0.1"
        ) from None
    last = "no answer"
    while True:
        for family, kind, proto, _, sockaddr in infos:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RunError(
                    f"rank {rank} could not reach the master at {addr}:{port} within "
                    f"{timeout_s:g} s (--timeout): {last}; is rank 0 running and MASTER_ADDR/"
                    f"MASTER_PORT right?"
                )
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
