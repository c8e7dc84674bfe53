"""`microbench compare BASE NEW`: per case the two values and their ratio; `--fail-on` gates."""

from __future__ import annotations

import argparse

from ..accept.compare import RULE_EXAMPLE, compare, parse_rule, short_name
from ..core.errors import RunError
from ..core.tables import text_table
from ..core.units import format_number, format_size


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("compare", help="compare two records or two suite directories: values, ratios, --fail-on rules")
    p.add_argument("base", metavar="BASE", help="the reference: a record (.json) or a suite directory")
    p.add_argument("new", metavar="NEW", help="the run to judge, of the same kind as BASE")
    p.add_argument(
        "--fail-on",
        action="append",
        default=[],
        metavar="RULE",
        help=f"METRIC:[+-]PERCENT%%, repeatable; exit 1 when a case breaks it, e.g. {RULE_EXAMPLE.replace('%', '%%')}; "
        f"no sign means 'worse by more than' (lower bandwidth, higher time)",
    )
    p.set_defaults(handler=run)


def _fmt(value: float) -> str:
    return format_number(value, 4)   # never 1.23e-05 in the table


def run(args: argparse.Namespace) -> int:
    rules = [parse_rule(text) for text in args.fail_on]
    result = compare(args.base, args.new, rules)
    for pair in result.pairs:
        ident = ", ".join(f"{k} {v}" for k, v in pair.identity.items() if v is not None and k != "probe")
        print(f"# {pair.name}: {pair.identity['probe']}" + (f" ({ident})" if ident else ""))
        for note in pair.notes:
            print(f"# note: {note}")
        table = [(line.case, format_size(line.size_bytes) if line.size_bytes is not None else "-",
                  short_name(line.metric), _fmt(line.base), _fmt(line.new),
                  f"{line.ratio:.3f}" if line.ratio is not None else "n/a",
                  ("FAIL " + ", ".join(line.failed) + (f" ({line.lost})" if line.lost else "")) if line.failed else
                  "within noise" if line.noise else "")
                 for line in pair.lines]
        print(text_table(table, headers=["case", "size", "metric", "base", "new", "new/base", "verdict"],
                       tablefmt="simple"))
        for label, cases in (("only in BASE", pair.only_base), ("only in NEW", pair.only_new)):
            if cases:
                print(f"# {label}: {', '.join(cases)}")
        print()
    for why in result.skipped:
        print(f"# skipped {why}")
    compared = sum(len(p.lines) for p in result.pairs)
    failures = result.failures
    if failures:
        # A value NEW lost (NaN, missing) is the worst: nothing about it is known.
        pair, line = max(failures, key=lambda f: float("inf") if f[1].lost else abs(1 - (f[1].ratio or 1)))
        how = line.lost if line.lost else f"x{line.ratio:.3f}"
        raise RunError(f"{len(failures)} of {compared} compared value(s) broke --fail-on "
                       f"({', '.join(r.text for r in rules)}); worst: {pair.name} {line.case} "
                       f"{format_size(line.size_bytes) if line.size_bytes is not None else ''} "
                       f"{short_name(line.metric)} {how}")
    noisy = sum(bool(line.noise) for p in result.pairs for line in p.lines)
    print(f"# compared {compared} value(s)" + (f"; all within {', '.join(r.text for r in rules)}" if rules else "")
          + (f" ({noisy} beyond the rule but within noise: the runs' iteration times, min to max, overlap)"
             if noisy else ""))
    return 0
