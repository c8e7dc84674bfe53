"""SIGINT and SIGTERM end a run the same way, once: the first raises KeyboardInterrupt where
the program is (unless it is already handling an error), later ones are only counted, so a
scheduler's Ctrl-C-then-SIGTERM never interrupts the saving of a partial record.

The count stays set: a KeyboardInterrupt that a library swallowed (during start-up, inside a
C call that retried) is raised again at the next `check()`, so an interrupted run never goes on
to measure as if nothing happened. Stdlib only: installed before anything heavy is imported.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM)
hits = 0


def handler(signum: int, frame: Any) -> None:
    global hits
    hits += 1
    if hits == 1 and sys.exc_info()[0] is None:
        raise KeyboardInterrupt


def install() -> None:
    if threading.current_thread() is not threading.main_thread():
        return  # signal handlers belong to the main thread (a library user's thread calls main())
    for sig in SIGNALS:
        signal.signal(sig, handler)


def pending() -> bool:
    return hits > 0


def check() -> None:
    """Raise KeyboardInterrupt if a signal arrived, even if its first raise was swallowed."""
    if hits:
        raise KeyboardInterrupt


# A launcher's note file (results.store.RECORD_NOTE_ENV; named here to stay stdlib-only).
_NOTE_ENV = "MICROBENCH_RECORD_NOTE"


def report_ready() -> None:
    """Tell the launcher that spawned this rank that a signal now ends it cleanly: before this,
    the interpreter is still starting and a forwarded Ctrl-C would print its own traceback."""
    note = os.environ.get(_NOTE_ENV)
    if note and os.environ.get("RANK"):
        try:
            with open(note, "a") as handle:
                handle.write(f"ready {os.environ['RANK']}\n")
        except OSError:
            pass
