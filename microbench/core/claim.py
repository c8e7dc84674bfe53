"""One holder at a time for a named thing that outlives a command (a lab, a bucket mount): an
exclusive, non-blocking flock on a lock file, held while the command sets the thing up. A second
command that asks while the first holds it is refused at once with one line naming the holder,
rather than both racing to create the same interfaces or state and both failing.

The lock files stay (empty but for the last holder's pid): removing one while another command
may be opening it would let two holders in. The kernel drops the lock when the holder exits,
however it ends."""

from __future__ import annotations

import fcntl
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from .errors import UsageError


@contextmanager
def exclusive(path: str | os.PathLike, busy: str) -> Iterator[None]:
    """Hold `path`'s lock for the block; UsageError "`busy` (pid N)" when another process does."""
    lock = Path(path)
    lock.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
            raise UsageError(f"{busy}{f' (pid {holder})' if holder.isdigit() else ''}") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)
