"""A rank's Python stacks, asked for just before the launcher ends it.

When one rank fails, its peers usually fail a moment later at their next collective and say
so. One that does not (blocked in I/O, waiting on a DataLoader worker, stuck in a lock) is killed
by the supervisor, and until now took with it the one fact that explains the hang: where it
was. Each local rank arms faulthandler on SIGUSR1, writing every thread's stack to a file of its
own in a directory the launcher names; the supervisor sends SIGUSR1, gives the rank a moment
to write, then kills it, and keeps what it wrote in the record. Python frames only (faulthandler
writes from the signal handler, without the GIL): enough to name the phase and the call.
Stdlib only: armed in `entry()` before anything heavy is imported.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import time
from pathlib import Path
from typing import Any, Iterable

DIR_ENV = "MICROBENCH_STACKS_DIR"
SIGNAL = signal.SIGUSR1
WAIT_S = 1.0  # faulthandler writes in microseconds; a busy machine may not run the rank at once
MAX_CHARS = 16_000  # per rank in the record: a few dozen threads' frames

_armed: Any = None  # the open file faulthandler writes to (it keeps only the descriptor)


def path_for(directory: str, rank: int) -> Path:
    return Path(directory) / f"rank{rank}.txt"


def arm() -> None:
    """In a rank that a local launcher started: SIGUSR1 dumps every thread's stack to its file."""
    global _armed
    directory, rank = os.environ.get(DIR_ENV), os.environ.get("RANK")
    if not directory or rank is None or _armed is not None:
        return
    try:
        _armed = open(path_for(directory, int(rank)), "w")
        faulthandler.register(SIGNAL, file=_armed, all_threads=True, chain=False)
    except (OSError, ValueError, RuntimeError):
        _armed = None  # no stacks on request; the rank runs as before


def ask(procs: Iterable[tuple[int, Any]], directory: str) -> dict[int, str]:
    """SIGUSR1 to each (rank, process) still running; wait up to WAIT_S for their files; return
    rank -> what it wrote (ranks that wrote nothing are left out)."""
    asked = []
    for rank, proc in procs:
        if proc.poll() is None:
            try:
                proc.send_signal(SIGNAL)
                asked.append(rank)
            except OSError:
                pass
    deadline = time.monotonic() + WAIT_S
    last: dict[int, str] = {}
    got: dict[int, str] = {}
    while asked and time.monotonic() < deadline:
        for rank in list(asked):
            text = _read(path_for(directory, rank))
            # Written, and the same at two looks: the dump is whole (it has no end marker).
            if text.strip() and text == last.get(rank):
                got[rank] = text
                asked.remove(rank)
            last[rank] = text
        if asked:
            time.sleep(0.02)
    # A dump still growing at the deadline is still the best account there is.
    got.update({rank: last[rank] for rank in asked if last.get(rank, "").strip()})
    return {rank: text[-MAX_CHARS:] for rank, text in got.items()}


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""
