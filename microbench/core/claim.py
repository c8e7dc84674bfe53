"""One holder at a time for a named thing that outlives a command (a lab, a bucket mount): an
exclusive, non-blocking flock on a lock file, held while the command sets the thing up. A second
command that asks while the first holds it is refused at once with one line naming the holder,
rather than both racing to create the same interfaces or state and both failing.

The holder removes the lock file as it lets go. A second command may have opened the file just
before: it then holds a lock on a name that no longer exists, sees that (the path's inode is not
its file's) and opens the path again, so two holders never each think they have it. The kernel
drops a lock when its holder exits, however it ends; a file left by a killed holder is taken over."""

from __future__ import annotations

import fcntl
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from .errors import UsageError


def _take(lock: Path, busy: str) -> int:
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
            os.close(fd)
            raise UsageError(f"{busy}{f' (pid {holder})' if holder.isdigit() else ''}") from None
        try:
            if os.stat(lock).st_ino == os.fstat(fd).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)  # the holder before us removed this name as we opened it: open it again


@contextmanager
def exclusive(path: str | os.PathLike, busy: str) -> Iterator[None]:
    """Hold `path`'s lock for the block; UsageError "`busy` (pid N)" when another process does."""
    lock = Path(path)
    lock.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = _take(lock, busy)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        try:
            os.unlink(lock)
        except OSError:
            pass
        os.close(fd)
