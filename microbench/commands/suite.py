"""`microbench suite`: the quickstart job, every probe once on the embedded defaults."""

from __future__ import annotations

import argparse
import socket
from pathlib import Path

from ..accept import junit, rules as accept, suite
from ..accept.suite import HEADLINE_COLUMN, default_steps
from ..core.errors import RunError
from ..core.tables import text_table
from ..results.outputs import check_results_dir
from ..results.store import atomic_write_text
from ..targets.workdir import check_base


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("suite", help="run every probe once on local ranks, local disk and an embedded S3 server")
    p.add_argument("--path", default=None, help="directory for storage and checkpoint probes (default: a temp dir)")
    p.add_argument("--only", default=None, help=f"comma list of steps: {', '.join(s.name for s in default_steps())}")
    p.add_argument("--results-dir", default="results", help="the suite writes results/suite-TIME/STEP.json")
    p.add_argument("--accept", default=None, metavar="THRESHOLDS",
                   help="acceptance thresholds (TOML or JSON, see examples/acceptance-*.toml): pass/fail per check")
    p.add_argument("--junit", default=None, metavar="PATH",
                   help="also write JUnit XML (one testcase per step and per acceptance check) for CI")
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
        print(text_table([(v.check.step, v.check.op, v.check.metric, v.status.upper(), v.detail) for v in verdicts],
                       headers=["step", "op", "metric", "acceptance", "value"], tablefmt="simple"))
        bad = [v for v in verdicts if v.status != "pass"]
        if bad:
            raise RunError(f"acceptance failed: {len(bad)} of {len(verdicts)} check(s) did not pass"
                           + (f"; {len(failed)} step(s) failed: {', '.join(failed)}" if failed else ""))
    if failed:
        raise RunError(f"{len(failed)} step(s) failed: {', '.join(failed)} (reasons in the table above)")
    return 0
