"""The command line: one subcommand per probe or tool, thin over library functions.

Only here do errors become exit codes: MicrobenchError -> its exit_code (2 misuse, 1 failure,
3 a verify whose measurements cannot tell pass from fail, 0 for a probe skipped with its reason)
and one line on stderr; never a traceback unless MICROBENCH_DEBUG=1.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import re
import sys
import traceback
from typing import Any, Sequence

from . import __version__
from .core import registry
from .core.errors import MicrobenchError, OutputClosed, ProbeUnavailable, RunError, UsageError
from .core.redaction import redact_text

# The tools: each module has add_parser(subparsers) and run(args) -> int. Probe commands are not
# listed here: they come from the registry (one ProbeSpec per probe module).
COMMAND_MODULES = ["env", "lab", "mount", "suite", "compose", "verify", "plot", "compare", "report", "hunt", "fleet"]
# Help for the first word of two-word probe commands (`storage posix`): the group, not its probes.
GROUP_HELP = {
    "storage": (
        "file, object-store and GPU-direct storage throughput",
        "Storage throughput and latency: posix (native engine), fio, and more.",
    ),
}


def measuring_commands() -> set[str]:
    """Commands whose figures depend on the native core (the others read records or set up the lab)."""
    return {spec.command[0] for spec in registry.specs()} | {"suite", "verify"}


def _warn_if_fallback(command: str) -> None:
    from .targets import native
    from .world.launch import RANK_VARIABLES, SPAWNED_ENV

    if command not in measuring_commands() or os.environ.get(SPAWNED_ENV):
        return  # a rank we launched: the launcher has said it already, on the same package
    if any(os.environ.get(var, "0") != "0" for var in RANK_VARIABLES):
        return  # only rank 0 prints
    warning = native.fallback_warning()
    if warning:
        # On stdout, as a '#' line like the tables' own notes: stderr keeps its one line for
        # errors, and whoever reads the figures sees this above them.
        print(f"# microbench {warning}", flush=True)


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # Treat "-5M" as a value, not an unknown flag, so `--sizes -5M` reaches the size parser
        # and gets its quoting message. No flag of ours starts with a digit.
        self._negative_number_matcher = re.compile(r"^-\d")

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="microbench",
        description="Collective, link, storage and checkpoint microbenchmarks for LLM-training clusters.",
    )
    parser.add_argument("--version", action="version", version=f"microbench {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name in COMMAND_MODULES[:3]:  # env, lab and mount, then the probes in their order, then the other tools
        importlib.import_module(f"microbench.commands.{name}").add_parser(sub)
    _add_probe_commands(sub)
    for name in COMMAND_MODULES[3:]:
        importlib.import_module(f"microbench.commands.{name}").add_parser(sub)
    return parser


def _add_probe_commands(sub: argparse._SubParsersAction) -> None:
    """One command per registered probe; two-word commands go under a group parser."""
    from .commands import generic

    groups: dict[str, argparse._SubParsersAction] = {}
    for spec in registry.specs():
        *group, leaf = spec.command
        parent = sub
        if group:
            name = " ".join(group)
            if name not in groups:
                help_text, description = GROUP_HELP.get(name, (f"{name} probes", None))
                p = sub.add_parser(name, help=help_text, description=description)
                groups[name] = p.add_subparsers(dest=f"{name}_command", metavar="KIND", parser_class=type(p))
                groups[name].required = True
            parent = groups[name]
        generic.add_probe_parser(parent, leaf, spec)


def _quiet_torch() -> None:
    """c10d logs every retry and failure with a C++ stack on stderr; our one line says it better.
    Read once when torch loads, so it must be set before the first `import torch`."""
    if not os.environ.get("MICROBENCH_DEBUG"):
        os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")


def _signals_as_interrupt() -> None:
    """SIGINT and SIGTERM (torchrun, Slurm, kill) end a run alike and once: the partial record
    is kept (see interrupts.py)."""
    from .targets import s3_deadline
    from .world import interrupts

    interrupts.install()
    # A signal whose first raise a library swallowed still ends an S3 request that would wait.
    s3_deadline.between_waits = interrupts.check


# A reader that closed our stdout (`microbench compose ... | head -1`) ends the command as it
# ends `yes | head -1`: quietly, with the SIGPIPE convention's status 128 + 13 = 141, so a
# script with `set -o pipefail` still sees that the output was cut short. Python ignores
# SIGPIPE and raises BrokenPipeError instead; _GuardedStdout turns it into OutputClosed
# wherever the write was (a progress line, a table), the record kept as partial.
EXIT_STDOUT_CLOSED = OutputClosed.exit_code
# Refused writes that are the machine's, not a bug: a full disk, a read-only mount, a quota.
_WRITE_REFUSED = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG)


def _stdout_to_devnull() -> None:
    """Point fd 1 at /dev/null: later writes and the interpreter's final flush go nowhere
    instead of raising again, and no file opened later can be given fd 1."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        if devnull != 1:
            os.dup2(devnull, 1)
            os.close(devnull)
    except (OSError, ValueError):
        pass


class _GuardedStdout:
    """sys.stdout while a command runs. The first write the reader refuses raises once, from
    wherever it was: OutputClosed for a reader gone (EPIPE), RunError naming stdout for a
    device that takes nothing (/dev/full's ENOSPC); every write after it is dropped, so a
    cleanup that prints cannot raise again."""

    def __init__(self, inner: Any):
        self._inner = inner
        self._failed = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def _guard(self, call: Any, *args: Any) -> Any:
        if self._failed:
            return None
        try:
            return call(*args)
        except OSError as exc:
            self._failed = True
            _stdout_to_devnull()
            if isinstance(exc, BrokenPipeError):
                raise OutputClosed() from None
            raise RunError(f"cannot write to stdout: {exc.strerror or exc}") from None

    def write(self, text: str) -> Any:
        return self._guard(self._inner.write, text)

    def writelines(self, lines: Any) -> Any:
        return self._guard(self._inner.writelines, lines)

    def flush(self) -> Any:
        return self._guard(self._inner.flush)


def _stdout_missing() -> bool:
    """Started with stdout closed (`>&-`): nothing could ever be printed."""
    if sys.stdout is None:
        return True
    try:
        os.fstat(1)
    except OSError:
        return True
    return False


def _abandon_records(reason: str) -> None:
    """Whatever ended the command, no record of this process stays "running"."""
    from .results.store import abandon_open

    abandon_open(reason)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if _stdout_missing():
        _stdout_to_devnull()
        print(
            "microbench: stdout is closed (started with >&-), so no result could be printed; "
            "send it somewhere instead, e.g. > /dev/null or > out.txt",
            file=sys.stderr,
        )
        return 1
    _quiet_torch()
    _signals_as_interrupt()
    real = sys.stdout
    sys.stdout = real if isinstance(real, _GuardedStdout) else _GuardedStdout(real)
    try:
        return _run(argv)
    finally:
        sys.stdout = real


def _run(argv: list[str]) -> int:
    try:
        args = build_parser().parse_args(argv)
        # Every output the arguments name (--json, --csv, --results-dir), once, before any work.
        from .results.outputs import check_outputs

        check_outputs(args)
        _warn_if_fallback(args.command)
        code = int(args.handler(args) or 0)
        sys.stdout.flush()  # a write refused at the very end still gets its one line
        return code
    except ProbeUnavailable as exc:
        print(f"microbench: skipped: {exc}", file=sys.stderr)
        return exc.exit_code
    except MicrobenchError as exc:
        _abandon_records(str(exc))
        print(f"microbench: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return _interrupted()
    except (OutputClosed, BrokenPipeError):
        _abandon_records(OutputClosed.reason)
        _stdout_to_devnull()
        return EXIT_STDOUT_CLOSED
    except OSError as exc:
        if exc.errno not in _WRITE_REFUSED:
            return _internal_error(exc)
        where = f" {str(exc.filename)!r}" if exc.filename is not None else ""
        line = f"cannot write{where}: {exc.strerror or exc}"
        _abandon_records(line)
        print(f"microbench: {redact_text(line)}", file=sys.stderr)
        return 1
    except SystemExit:
        raise
    # A bug (or a library's BaseException, like torch's CheckpointException): still one line,
    # with the traceback on request.
    except BaseException as exc:
        from .world import interrupts

        # After a signal, what fails is the signal's doing, not a bug: an import it cut short
        # leaves the module half made, and the next import of it raises ImportError.
        return _interrupted() if interrupts.hits else _internal_error(exc)


def _interrupted() -> int:
    _abandon_records("interrupted")
    print("microbench: interrupted", file=sys.stderr)
    return 1


def _internal_error(exc: BaseException) -> int:
    if os.environ.get("MICROBENCH_DEBUG"):
        traceback.print_exc()
    first = redact_text((str(exc).strip().splitlines() or [""])[0][:300])
    _abandon_records(f"internal error: {type(exc).__name__}: {first}")
    print(
        f"microbench: internal error: {type(exc).__name__}: {first} (set MICROBENCH_DEBUG=1 for a traceback)",
        file=sys.stderr,
    )
    return 1


if __name__ == "__main__":
    sys.exit(main())
