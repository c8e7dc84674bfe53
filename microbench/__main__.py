"""`python -m microbench` and the `microbench` console script."""

import os
import sys


def entry() -> None:
    # Before anything heavy is imported: a Ctrl-C or SIGTERM in the first second of start-up
    # still ends with one line and exit 1, never a traceback or a silent death.
    from .world import interrupts, stacks

    interrupts.install()
    interrupts.report_ready()
    stacks.arm()  # a local rank: its stacks on the launcher's request, before it is ended
    try:
        from .cli import main

        interrupts.check()  # a signal counted while the import could not raise it
    except KeyboardInterrupt:
        print("microbench: interrupted", file=sys.stderr)
        # As below: once decided, a second signal (a launcher forwards one, the user presses
        # again) must not land in the teardown, where Python has put back the default handlers
        # and it would end the process by SIGINT after its one line (seen on a starting rank).
        interrupts.closing()
        _leave(1)
    try:
        code = main()
    except KeyboardInterrupt:
        # A signal as main() returned, after its own handling: the work is done, but the run
        # was interrupted all the same, and says so like any other (never a death by SIGINT).
        print("microbench: interrupted", file=sys.stderr)
        code = 1
    interrupts.closing()
    _leave(code)


def _leave(code: int) -> None:
    """Exit without the interpreter's teardown, always. After importing torch it takes 1-4 s
    (modules, thread pools and caches finalized one by one), paid by every rank and suite step;
    a rank that failed would wait in it on process groups and store connections to peers gone or
    frozen; and a signal handled in it (a forwarded SIGINT that a launcher's rank or the user
    sends twice) ended runs whose line was already printed with 130 or -2 instead of their code.
    Every record is closed by now and nothing registers atexit work."""
    try:
        try:
            sys.stdout.flush()
        except BrokenPipeError:
            # The reader left before the last buffered lines reached it: the same end as a
            # closed stdout met inside main() (cli.EXIT_STDOUT_CLOSED), whichever write saw it.
            code = code or 128 + 13
        sys.stderr.flush()
    finally:
        os._exit(code)


def _register_for_forks() -> None:
    """A warm suite forks its steps and ranks into `entry` (world/fork.py sits below the command
    line and is handed the function rather than importing it)."""
    from .world import fork

    fork.set_entry(entry)


_register_for_forks()


if __name__ == "__main__":
    entry()
