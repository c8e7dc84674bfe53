"""SIGINT and SIGTERM end a run the same way, once: the first raises KeyboardInterrupt where
the program is (unless it is already handling an error), later ones are only counted, so a
scheduler's Ctrl-C-then-SIGTERM never interrupts the saving of a partial record.

The count stays set: a KeyboardInterrupt that a library swallowed (during start-up, inside a
C call that retried) is raised again at the next `check()`, so an interrupted run never goes on
to measure as if nothing happened. Stdlib only: installed before anything heavy is imported.

This is the one module that installs and restores SIGINT/SIGTERM handlers: `install()` for the
life of the CLI, `handled()` (or `take` and `restore`) around a stretch that needs them (the
runner's sweep, a launcher that forwards signals to its ranks, a library caller without the
CLI), `closing()` once the exit code is decided, `fresh_process()` in a fork (prefork.py).
Elsewhere signals are only sent (supervise.py, s3server.py).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator

SIGNALS = (signal.SIGINT, signal.SIGTERM)
hits = 0
forwarded = 0  # taken by a handler given to take()/handled() (a launcher forwarding to its ranks)
closed = False  # the exit code is decided: signals are counted, never raised
deferring = 0  # inside deferred(): signals are counted, raised when the block ends


def handler(signum: int, frame: Any) -> None:
    global hits
    hits += 1
    if hits == 1 and not closed and not deferring and sys.exc_info()[0] is None and not _in_unraisable_callback(frame):
        raise KeyboardInterrupt


@contextmanager
def deferred() -> Iterator[None]:
    """Count signals during the block and raise the first at its end. For torch's first import:
    its C++ initialisers call back into Python, and a KeyboardInterrupt raised there cannot
    cross pybind11, which calls std::terminate: the rank died by SIGABRT with a C++ backtrace on
    stderr instead of ending with the launcher's one line."""
    global deferring
    deferring += 1
    try:
        yield
    finally:
        deferring -= 1
    if not deferring:
        check()


def _in_unraisable_callback(frame: Any) -> bool:
    # The import lock's weakref callback: an exception raised there cannot propagate, Python
    # prints "Exception ignored in ..." on stderr instead. Counted only; `check()` raises it.
    code = getattr(frame, "f_code", None)
    return code is not None and code.co_name == "cb" and "importlib" in code.co_filename


def _main_thread() -> bool:
    # Signal handlers belong to the main thread (a library user's thread may call main()).
    return threading.current_thread() is threading.main_thread()


def install() -> None:
    """For the life of the process: the CLI keeps this handler until main() has returned."""
    if _main_thread():
        for sig in SIGNALS:
            signal.signal(sig, handler)


def take(on_signal: Callable[[int, Any], None] | None = None) -> dict[int, Any]:
    """SIGINT and SIGTERM go to `on_signal` (by default `handler`) until `restore` is given what
    this returns: the handlers that were there before (the CLI's own, under the CLI)."""
    previous: dict[int, Any] = {}
    if _main_thread():
        for sig in SIGNALS:
            previous[sig] = signal.getsignal(sig)
            signal.signal(sig, _noting(on_signal) if on_signal else handler)
    return previous


def _noting(on_signal: Callable[[int, Any], None]) -> Callable[[int, Any], None]:
    # A launcher's own handler forwards the signal to its ranks and returns their exit code;
    # its caller still learns that the run was interrupted (`seen`), to say so in the record.
    def noted(signum: int, frame: Any) -> None:
        global forwarded
        forwarded += 1
        on_signal(signum, frame)

    return noted


def seen() -> bool:
    """A signal arrived in this process, whether raised here or taken by a launcher's handler."""
    return hits > 0 or forwarded > 0


def restore(previous: dict[int, Any]) -> None:
    for sig, before in previous.items():
        if before is not None:  # None: set outside Python, nothing we can put back
            signal.signal(sig, before)


@contextmanager
def handled(on_signal: Callable[[int, Any], None] | None = None) -> Iterator[None]:
    """`take` for the block, `restore` after it."""
    previous = take(on_signal)
    try:
        yield
    finally:
        restore(previous)


def closing() -> None:
    """The exit code is decided: block SIGINT and SIGTERM so that a signal now (in the flush,
    the interpreter's teardown) cannot turn a finished run into a death by signal (-2) or a
    traceback. A blocked signal still pending at exit is dropped; SIGKILL still works. One that
    arrived just before the block runs its Python handler just after it: `closed` makes that a
    count, not a KeyboardInterrupt that nothing catches (Python then exits 130, SIGINT blocked)."""
    global closed
    closed = True
    if _main_thread():
        signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)


def fresh_process() -> None:
    """In a fork (prefork.py): start as a new interpreter would, with no signal counted, none
    blocked and the default handlers; what the parent counted or blocked is its own."""
    global hits, closed, forwarded, deferring
    hits, closed, forwarded, deferring = 0, False, 0, 0
    signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


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
