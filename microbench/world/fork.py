"""Starting a microbench process by fork, from one that has already imported torch and DCP.

`microbench suite` starts a process per step, and the world steps 2 ranks each; every fresh
interpreter imports torch (2.6 s of CPU here) and the checkpoint ranks torch.distributed.
checkpoint (1.5 s more). On a 2-core machine that start-up was ~12 s of the suite's 70, none of
it measurement. A suite that `warm()`s once instead forks each step, and each step forks its
local ranks: the same code and the same measurements, each still its own process (one probe's
crash cannot take another down), without the imports.

Only where a fork is safe: never with a GPU possible (a CUDA context does not survive a fork,
and asking torch whether CUDA is there already poisons one), never for ranks that need a command
prefix (`ip netns exec` for a lab host), and only in a process whose torch has done no work
(its thread pools would be lost in the child): `warm()` imports and nothing else, and is called
by the suite before it runs anything. Elsewhere (`microbench nccl` run by hand, torchrun, a GPU
node) processes start as fresh interpreters, as before.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Any, Callable, Sequence

from .backends import gpu_possible

# Set in the children it starts, for the record: how this process came to be.
FORKED_ENV = "MICROBENCH_FORKED"
_warm = False
_entry: Callable[[], None] | None = None


def warm() -> bool:
    """Import what steps and ranks would import, so that forks of this process start ready.
    False (and nothing changes) where forking is not safe or torch is missing."""
    global _warm
    if _warm:
        return True
    if not hasattr(os, "fork") or gpu_possible() or _entry is None:
        return False
    try:
        import torch  # noqa: F401

        # The first DTensor.from_local imports torch._dynamo: 0.8 s in each checkpoint rank.
        import torch._dynamo  # noqa: F401
        import torch.distributed  # noqa: F401
        import torch.distributed.checkpoint  # noqa: F401
        import torch.distributed.tensor  # noqa: F401

        from ..core import registry

        # The command line that called us has built its parser, so every command module is
        # imported already; the probes are imported here for a process that has not yet.
        registry.specs()
    except Exception:  # a broken torch: fresh interpreters will say why, one line each
        return False
    # the S3 steps' clients (0.3 and 0.2 s) and DCP's fsspec storage, where installed
    for optional in ("s3fs", "boto3", "torch.distributed.checkpoint._fsspec_filesystem"):
        try:
            __import__(optional)
        except Exception:
            pass
    _warm = True
    return True


def set_entry(entry: Callable[[], None]) -> None:
    """The program a fork runs (`microbench.__main__.entry`, which registers itself): given from
    above, since this module sits below the command line and must not import it. A process that
    never registered one (a library caller, a test) spawns instead of forking."""
    global _entry
    _entry = entry


def ready() -> bool:
    """This process (or the one it was forked from) is warm: its children may be forks."""
    return _warm


class Forked:
    """The part of subprocess.Popen that the suite and the rank supervisor use, for a fork."""

    def __init__(self, pid: int):
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired([str(self.pid)], timeout or 0.0)
            time.sleep(0.005)
        return self.returncode  # type: ignore[return-value]

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


Target = Any  # None (inherit), subprocess.DEVNULL, or an open file object


def start(argv: Sequence[str], env: dict[str, str], *, stdin: Target = subprocess.DEVNULL,
          stdout: Target = None, stderr: Target = None, new_session: bool = False) -> Forked:
    """`python -m microbench ARGV` with ENV, as a fork of this warm process."""
    assert _warm, "prefork.start needs prefork.warm() first"
    sys.stdout.flush()
    sys.stderr.flush()
    devnull = os.open(os.devnull, os.O_RDWR)
    fds = {0: _fd(stdin, devnull), 1: _fd(stdout, devnull), 2: _fd(stderr, devnull)}
    pid = os.fork()
    if pid:
        os.close(devnull)
        return Forked(pid)
    code = 1
    try:
        _become(argv, env, fds, new_session)  # leaves through the CLI's own os._exit
    except SystemExit as exc:  # argparse's usage errors, as a fresh interpreter would exit
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException as exc:  # noqa: BLE001 - never return into the parent's code
        print(f"microbench: could not start a forked process: {type(exc).__name__}: {exc}", file=sys.stderr)
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _fd(target: Target, devnull: int) -> int | None:
    if target is None:
        return None
    if target == subprocess.DEVNULL:
        return devnull
    return target.fileno() if hasattr(target, "fileno") else int(target)


def _become(argv: Sequence[str], env: dict[str, str], fds: dict[int, int | None], new_session: bool) -> None:
    from . import interrupts

    assert _entry is not None, "fork.start needs the entry set by microbench.__main__"
    if new_session:
        os.setsid()
    for std, fd in fds.items():
        if fd is not None:
            os.dup2(fd, std)
    os.environ.clear()
    os.environ.update(env)
    os.environ[FORKED_ENV] = "1"
    sys.argv = [os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "__main__.py"), *argv]
    interrupts.fresh_process()

    _entry()

