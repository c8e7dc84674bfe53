"""`microbench suite`: the quickstart job, every probe once on the embedded defaults."""

from __future__ import annotations

import argparse
import json
import os
import socket
import tempfile
import time
from pathlib import Path

from tabulate import tabulate

from ..accept import rules as accept, junit
from ..core.errors import RunError, UsageError
from ..results.store import atomic_write_text
from ..core.registry import SuiteStep
from ..accept.suite import default_steps, find_step, run_step, shared_setup


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


def select_steps(only: str | None) -> list[SuiteStep]:
    """The steps `--only` names (current names or former ones, e.g. collectives), in suite order."""
    steps = list(default_steps())
    if only is None:
        return steps
    wanted = [w.strip() for w in only.split(",") if w.strip()]
    names = sorted(s.name for s in steps)
    example = f"e.g. --only {','.join(s.name for s in steps[:2])}"
    if not wanted:
        # An empty list is not "no filter": it would run every probe, the opposite of asking for none.
        raise UsageError(f"invalid --only {only!r}: empty; expected some of {', '.join(names)} ({example})")
    chosen = set()
    for name in wanted:
        step = find_step(name, steps)
        if step is None:
            raise UsageError(f"invalid --only {name!r}: expected some of {', '.join(names)} ({example})")
        chosen.add(step.name)
    return [s for s in steps if s.name in chosen]


def run(args: argparse.Namespace) -> int:
    checks = accept.load_checks(args.accept) if args.accept else None
    junit_path = junit.check_writable(args.junit) if args.junit else None
    steps = select_steps(args.only)
    out_dir = Path(args.results_dir) / time.strftime("suite-%Y%m%d-%H%M%S", time.gmtime())
    suffix = 0
    while out_dir.exists():
        suffix += 1
        out_dir = out_dir.with_name(f"{out_dir.name.split('+')[0]}+{suffix}")
    out_dir.mkdir(parents=True)
    with tempfile.TemporaryDirectory(prefix="microbench-suite-", dir=args.path) as scratch, \
            shared_setup(steps) as shared_env:
        child_env = {**os.environ, **shared_env}
        results = []
        for step in steps:
            print(f"# {step.name} ...", flush=True)
            results.append(run_step(step, out_dir, scratch, env=child_env))
    table = [(r.step.name, r.status, f"{r.seconds:.0f}", r.summary()) for r in results]
    print(tabulate(table, headers=["step", "result", "s", "headline / reason"], tablefmt="simple"))
    print(f"# records: {out_dir}")
    failed = [r.step.name for r in results if r.status == "fail"]
    verdicts = None
    if checks is not None:
        # Under every name of the step: thresholds written for a former name (collectives) still apply.
        records = {name: (json.loads(Path(r.record).read_text()) if r.record else None)
                   for r in results for name in (r.step.name, *r.step.aliases)}
        verdicts = accept.evaluate(checks, records)
    if junit_path is not None:
        try:
            atomic_write_text(junit_path, junit.build(results, verdicts, hostname=socket.gethostname()))
        except OSError as exc:
            raise RunError(f"cannot write --junit {str(junit_path)!r}: {exc.strerror}") from None
        print(f"# junit: {junit_path}")
    if verdicts is not None:
        print()
        print(tabulate([(v.check.step, v.check.op, v.check.metric, v.status.upper(), v.detail) for v in verdicts],
                       headers=["step", "op", "metric", "acceptance", "value"], tablefmt="simple"))
        bad = [v for v in verdicts if v.status != "pass"]
        if bad:
            raise RunError(f"acceptance failed: {len(bad)} of {len(verdicts)} check(s) did not pass"
                           + (f"; {len(failed)} step(s) failed: {', '.join(failed)}" if failed else ""))
    if failed:
        raise RunError(f"{len(failed)} step(s) failed: {', '.join(failed)} (reasons in the table above)")
    return 0
