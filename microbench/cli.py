"""The command line: one subcommand per probe or tool, thin over library functions.

Only here do errors become exit codes: MicrobenchError -> its exit_code (2 misuse, 1 failure,
0 for a probe skipped with its reason) and one line on stderr; never a traceback unless
MICROBENCH_DEBUG=1.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
import traceback
from typing import Sequence

from . import __version__
from .core import registry
from .core.errors import MicrobenchError, ProbeUnavailable, UsageError
from .core.redaction import redact_text

# The tools: each module has add_parser(subparsers) and run(args) -> int. Probe commands are not
# listed here: they come from the registry (one ProbeSpec per probe module).
COMMAND_MODULES = ["env", "lab", "mount", "suite", "compose", "verify", "plot", "compare", "report", "hunt", "fleet"]
# Help for the first word of two-word probe commands (`storage posix`): the group, not its probes.
GROUP_HELP = {
    "storage": ("file, object-store and GPU-direct storage throughput",
                "Storage throughput and latency: posix (native engine), fio, and more."),
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
    parser = _Parser(prog="microbench", description="Collective, link, storage and checkpoint "
                     "microbenchmarks for LLM-training clusters.")
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
    from .world import interrupts

    interrupts.install()


# A reader that closed our stdout (`microbench compose ... | head -1`) ends the command as it
# ends `yes | head -1`: quietly, with the SIGPIPE convention's status 128 + 13 = 141, so a
# script with `set -o pipefail` still sees that the output was cut short. Python ignores
# SIGPIPE and raises BrokenPipeError instead; nothing is printed about it.
EXIT_STDOUT_CLOSED = 128 + 13


def _stdout_closed() -> int:
    # Point stdout at /dev/null so the interpreter's final flush does not raise again
    # ("Exception ignored ... BrokenPipeError") on the way out.
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass
    return EXIT_STDOUT_CLOSED


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    _quiet_torch()
    _signals_as_interrupt()
    try:
        args = build_parser().parse_args(argv)
        # Every output the arguments name (--json, --csv, --results-dir), once, before any work.
        from .results.outputs import check_outputs

        check_outputs(args)
        _warn_if_fallback(args.command)
        return int(args.handler(args) or 0)
    except ProbeUnavailable as exc:
        print(f"microbench: skipped: {exc}", file=sys.stderr)
        return exc.exit_code
    except MicrobenchError as exc:
        print(f"microbench: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("microbench: interrupted", file=sys.stderr)
        return 1
    except BrokenPipeError:
        return _stdout_closed()
    except SystemExit:
        raise
    # A bug (or a library's BaseException, like torch's CheckpointException): still one line,
    # with the traceback on request.
    except BaseException as exc:
        if os.environ.get("MICROBENCH_DEBUG"):
            traceback.print_exc()
        first = redact_text((str(exc).strip().splitlines() or [""])[0][:300])
        print(f"microbench: internal error: {type(exc).__name__}: {first} "
              f"(set MICROBENCH_DEBUG=1 for a traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
