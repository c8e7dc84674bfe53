"""`lab exec`: a command run inside one lab host, as if logged in there: its network namespace
(`ip netns exec`, which also shows the namespace's own interfaces under /sys/class/net), its
own host name (a UTS namespace named h<i>, so the records it writes say which node they are
from), and its cgroups when the host is throttled (lab/cgroups.py), which every process the
command starts inherits."""

from __future__ import annotations

import ctypes
import os
import subprocess
from pathlib import Path

from ..core.errors import RunError, UsageError
from . import cgroups as labcg, namespaces as labmod

_CLONE_NEWUTS = 0x04000000


def parse_host(text: str, lab: labmod.Lab) -> int:
    """`h2` -> 2, one of the lab's hosts."""
    raw = str(text).strip()
    index = int(raw[1:]) if raw[:1] == "h" and raw[1:].isdigit() else None
    if index is None or index not in {h.index for h in lab.hosts}:
        raise UsageError(f"invalid --host {text!r}: expected one of the lab's hosts, h0 to h{len(lab.hosts) - 1}, "
                         f"e.g. --host h1")
    return index


def host_name(index: int) -> str:
    """The host name a lab host's processes see: what `hunt` and the fleet call it."""
    return f"h{index}"


def _enter(procs: list[Path], name: str) -> None:
    """In the child between fork and exec: join the host's cgroups, then a UTS namespace of its
    own with the host's name: a few writes and two system calls, nothing that takes a lock."""
    for path in procs:
        fd = os.open(path, os.O_WRONLY)
        try:
            os.write(fd, str(os.getpid()).encode())
        finally:
            os.close(fd)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(_CLONE_NEWUTS) != 0 or libc.sethostname(name.encode(), len(name)) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWUTS)/sethostname")


def run(lab_name: str, host: str, argv: list[str]) -> int:
    """Run `argv` in a lab host and wait for it; its exit status."""
    lab = labmod.get(lab_name)
    index = parse_host(host, lab)
    argv = argv[1:] if argv[:1] == ["--"] else argv
    if not argv:
        raise UsageError(f"lab exec needs a command after --, e.g. microbench lab exec --name {lab.name} "
                         f"--host h{index} -- microbench suite --results-dir results/h{index}")
    procs = labcg.procs_files(lab.name, index)
    netns = lab.hosts[[h.index for h in lab.hosts].index(index)].netns
    try:
        child = subprocess.Popen(["ip", "netns", "exec", netns, *argv],
                                 preexec_fn=lambda: _enter(procs, host_name(index)))
    except subprocess.SubprocessError as exc:
        raise RunError(f"cannot enter lab host h{index} of {lab.name!r} ({exc}); it needs root: cgroups and a "
                       f"UTS namespace") from None
    except OSError as exc:
        raise RunError(f"cannot run `ip netns exec` for lab host h{index}: {exc.strerror or exc}") from None
    try:
        return child.wait()
    except KeyboardInterrupt:
        # The command got the same Ctrl-C (one process group): let it end its own way first.
        child.wait()
        raise
