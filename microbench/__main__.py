"""`python -m microbench` and the `microbench` console script."""

import os
import sys


def entry() -> None:
    # Before anything heavy is imported: a Ctrl-C or SIGTERM in the first second of start-up
    # still ends with one line and exit 1, never a traceback or a silent death.
    from . import interrupts

    interrupts.install()
    interrupts.report_ready()
    try:
        from .cli import main
    except KeyboardInterrupt:
        print("microbench: interrupted", file=sys.stderr)
        sys.exit(1)
    code = main()
    if code != 0 and os.environ.get("WORLD_SIZE"):
        # A rank that failed has said why and closed its record; the interpreter's teardown
        # would now wait on process groups and store connections to peers gone or frozen.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    entry()
