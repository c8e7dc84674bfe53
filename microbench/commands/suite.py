"""`microbench suite`: the quickstart job, every probe once on the embedded defaults."""

from __future__ import annotations

import argparse
import shlex
import socket
import tempfile
from pathlib import Path

from ..accept import junit, rules as accept, suite
from ..accept.suite import HEADLINE_COLUMN, default_steps
from ..core import registry
from ..core.errors import RunError, UsageError
from ..core.registry import SuiteStep
from ..core.tables import text_table
from ..results.outputs import check_results_dir
from ..results.store import atomic_write_text
from ..targets.workdir import check_base
from . import generic


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("suite", help="run every probe once on local ranks, local disk and an embedded S3 server")
    p.add_argument("--path", default=None, help="directory for storage and checkpoint probes (default: a temp dir)")
    p.add_argument("--only", default=None, help=f"comma list of steps: {', '.join(s.name for s in default_steps())}")
    p.add_argument("--results-dir", default="results", help="the suite writes results/suite-TIME/STEP.json")
    p.add_argument(
        "--step-args",
        action="append",
        default=[],
        metavar="STEP=ARGS",
        help="more arguments for one step, after its own (a flag given again wins), checked before any "
        "step runs; repeatable, e.g. --step-args 'storage posix=--size 1G' --step-args 'compute=--tokens 64'",
    )
    p.add_argument(
        "--accept",
        default=None,
        metavar="THRESHOLDS",
        help="acceptance thresholds (TOML or JSON, see examples/acceptance-*.toml): pass/fail per check",
    )
    p.add_argument(
        "--junit",
        default=None,
        metavar="PATH",
        help="also write JUnit XML (one testcase per step and per acceptance check) for CI",
    )
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    checks = accept.load_checks(args.accept) if args.accept else None
    junit_path = junit.check_writable(args.junit) if args.junit else None
    steps = suite.select_steps(args.only)
    if checks is not None:
        accept.check_steps_run(checks, steps)
    check_results_dir(args.results_dir)
    if args.path is not None:
        # Before suite-TIME/ is made: a bad --path once left an empty results directory behind.
        check_base(args.path, writable=True)
    steps = suite.with_step_args(steps, parse_step_args(args.step_args, steps, args.path or tempfile.gettempdir()))
    out_dir = suite.new_suite_dir(Path(args.results_dir))
    results = suite.run_steps(steps, out_dir, args.path, before=lambda step: print(f"# {step.name} ...", flush=True))
    table = [(r.step.name, r.status, f"{r.seconds:.0f}", r.summary()) for r in results]
    print(text_table(table, headers=["step", "result", "s", HEADLINE_COLUMN], tablefmt="simple"))
    print(f"# records: {out_dir}")
    failed = [r.step.name for r in results if r.status == "fail"]
    verdicts = None
    if checks is not None:
        verdicts = accept.evaluate(checks, suite.records_by_step_name(results))
    if junit_path is not None:
        try:
            atomic_write_text(junit_path, junit.build(results, verdicts, hostname=socket.gethostname()))
        except OSError as exc:
            raise RunError(f"cannot write --junit {str(junit_path)!r}: {exc.strerror}") from None
        print(f"# junit: {junit_path}")
    if verdicts is not None:
        print()
        print(
            text_table(
                [(v.check.step, v.check.op, v.check.metric, v.status.upper(), v.detail) for v in verdicts],
                headers=["step", "op", "metric", "acceptance", "value"],
                tablefmt="simple",
            )
        )
        bad = [v for v in verdicts if v.status != "pass"]
        if bad:
            raise RunError(
                f"acceptance failed: {len(bad)} of {len(verdicts)} check(s) did not pass"
                + (f"; {len(failed)} step(s) failed: {', '.join(failed)}" if failed else "")
            )
    if failed:
        raise RunError(f"{len(failed)} step(s) failed: {', '.join(failed)} (reasons in the table above)")
    return 0


# The suite places each step's record itself (suite-TIME/STEP.json) and runs it on local ranks.
_SUITE_OWNS = ("--json", "--results-dir", "--lab")


class _StepParser(argparse.ArgumentParser):
    """A probe's own parser, whose errors are the suite's misuse (exit 2, one line)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message)


def parse_step_args(given: list[str], steps: list[SuiteStep], path: str) -> dict[str, tuple[str, ...]]:
    """`--step-args STEP=ARGS` values, by step name: each step one the suite runs, each ARGS split
    as a shell would and parsed, after the step's own arguments and any given for it before, by
    its probe's command (flags and values, then the probe's own checks, with `path` for the
    step's scratch directory), so misuse is refused before any step runs."""
    extra: dict[str, tuple[str, ...]] = {}
    for value in given:
        name, sep, rest = value.partition("=")
        name = name.strip()
        if not sep or not name:
            raise UsageError(f"invalid --step-args {value!r}: expected STEP=ARGS ({_EXAMPLE})")
        step = suite.find_step(name, steps)
        if step is None:
            raise UsageError(
                f"invalid --step-args {value!r}: {name!r} is not a step this suite runs "
                f"(it runs {', '.join(s.name for s in steps)}; {_EXAMPLE})"
            )
        try:
            words = tuple(shlex.split(rest))
        except ValueError as exc:
            raise UsageError(f"invalid --step-args {value!r}: {exc} ({_EXAMPLE})") from None
        owned = [flag for flag in (w.split("=", 1)[0] for w in words) if flag in _SUITE_OWNS]
        if owned:
            raise UsageError(f"invalid --step-args {value!r}: the suite sets {owned[0]} itself ({_EXAMPLE})")
        if any(w in ("-h", "--help") for w in words):
            raise UsageError(f"invalid --step-args {value!r}: --help is not a step argument ({_EXAMPLE})")
        extra[step.name] = extra.get(step.name, ()) + words
        _check_step_argv(step, extra[step.name], value, path)
    return extra


_EXAMPLE = "e.g. --step-args 'storage posix=--size 1G'"


def _check_step_argv(step: SuiteStep, words: tuple[str, ...], value: str, path: str) -> None:
    """The step's arguments and `words` through its probe's parser and option parsers: an unknown
    flag or a bad value is refused here, quoted, as the probe itself would refuse it."""
    found = registry.suite_step(step.name)
    assert found is not None, step.name  # select_steps only returns registered steps
    spec, declared = found
    parser = _StepParser(prog=f"microbench {' '.join(spec.command)}", add_help=False)
    sub = parser.add_subparsers(dest="command", parser_class=_StepParser)
    generic.add_probe_parser(sub, "step", spec)
    try:
        args = parser.parse_args(["step", *(a.format(path=path) for a in declared.argv), *words])
        generic.checked_config(spec, args)
    except UsageError as exc:
        raise UsageError(f"invalid --step-args {value!r}: {exc}") from None
