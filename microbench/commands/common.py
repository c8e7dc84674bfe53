"""Flags and plumbing every sweeping subcommand shares."""

from __future__ import annotations

import argparse
from typing import Any

from ..core.errors import UsageError
from ..core.units import parse_number, parse_positive_int, parse_timeout  # noqa: F401 (parse_timeout: its home is core.units)
from ..results import write_csv
from ..results.outputs import check_new_file
from ..run.runner import SweepSettings


def add_sweep_options(p: argparse.ArgumentParser, *, warmup: int = 5, iters: int = 20, budget_s: float = 2.0) -> None:
    g = p.add_argument_group("sweep")
    g.add_argument("--warmup", default=str(warmup), help=f"untimed iterations per case (default {warmup})")
    g.add_argument("--iters", default=str(iters), help=f"timed iterations per case (default {iters})")
    g.add_argument("--budget", default=str(budget_s), metavar="SECONDS",
                   help=f"cap timed work per case to about this long, never below 3 iterations; 0 = no cap "
                        f"(default {budget_s:g})")
    g.add_argument("--json", metavar="PATH", help="write the result record here (default: results/KIND-TIME.json)")
    g.add_argument("--csv", metavar="PATH", help="also write one flat CSV row per case")
    g.add_argument("--results-dir", default="results", metavar="DIR", help="where records go without --json")
    g.add_argument("--progress", choices=("auto", "on", "off"), default="auto",
                   help="progress bar on stderr (auto: only on a terminal)")


def settings_from_args(args: argparse.Namespace, *, check: bool = True) -> SweepSettings:
    warmup = _nonneg_int(args.warmup, "--warmup")
    iters = parse_positive_int(args.iters, what="--iters", example="20")
    budget = parse_number(args.budget, what="--budget", example="2", minimum=0.0)
    progress = {"auto": None, "on": True, "off": False}[args.progress]
    return SweepSettings(warmup=warmup, iters=iters, budget_s_per_case=budget or None,
                         min_iters=min(3, iters), check=check, progress=progress)


def check_csv_target(path: str | None) -> None:
    """Refuse a --csv that could not be written, before anything is measured, as --json is:
    write_csv itself refuses to overwrite, but only once the sweep is over."""
    if path:
        check_new_file(path, "--csv", noun="CSV file", kept="results")


def _nonneg_int(text: Any, what: str) -> int:
    try:
        value = int(str(text))
    except ValueError:
        raise UsageError(f"invalid {what} {text!r}: expected a whole number >= 0, e.g. 5") from None
    if value < 0:
        raise UsageError(f"invalid {what} {text!r}: must be 0 or more, e.g. 5")
    return value


def write_outputs(args: argparse.Namespace, outcome: Any) -> None:
    if getattr(args, "csv", None):
        write_csv(args.csv, outcome.rows)
