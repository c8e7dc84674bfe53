"""`microbench report RESULTS... [--out report.html]`: one self-contained HTML file."""

from __future__ import annotations

import argparse

from ..accept import report, rules as accept
from ..accept.compare import RULE_EXAMPLE, parse_rule
from ..accept.fleet import html as fleet_html
from ..core.errors import RunError
from ..results.store import atomic_write_text


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="one self-contained HTML report (env, tables, plots, verdicts, ratios)")
    p.add_argument(
        "results",
        nargs="*",
        metavar="RESULTS",
        help="suite directories or record files (the first is the compare base)",
    )
    p.add_argument("--out", default=None, metavar="FILE",
                   help="the HTML file to write (never overwritten) (default a new results/report-<time>.html)")
    p.add_argument(
        "--accept", default=None, metavar="THRESHOLDS", help="acceptance thresholds to show verdicts for each run"
    )
    p.add_argument("--fleet", default=None, metavar="FLEET_RECORD",
                   help="a fleet record (`microbench fleet --json`): its verdicts and a strip plot per metric")
    p.add_argument("--fail-on", action="append", default=[], metavar="RULE",
                   help=f"compare rules to mark in the ratios, e.g. {RULE_EXAMPLE.replace('%', '%%')}")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    target = report.check_out(args.out)
    rules = [parse_rule(text) for text in args.fail_on]
    checks = accept.load_checks(args.accept) if args.accept else None
    fleet = fleet_html.load(args.fleet) if args.fleet else None
    runs = report.load_runs(args.results) if args.results or fleet is None else []
    text = report.build(runs, checks=checks, rules=rules, fleet=fleet)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)   # results/ on a first report without --out
        atomic_write_text(target, text)
    except OSError as exc:
        raise RunError(f"cannot write --out {str(target)!r}: {exc.strerror}") from None
    print(
        f"# report: {target} ({len(text) / 1024:.0f} KiB, "
        f"{sum(len(r.records) for r in runs)} records from {len(runs)} run(s))"
    )
    return 0
