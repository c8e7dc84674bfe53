"""What `microbench fleet` is asked: its option table (core/options.py), each flag declared once
here with its help and its parser, and the sources (directories, globs, s3:// prefixes)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ...core import units
from ...core.errors import UsageError
from ...core.options import option, text

DEFAULT_MODEL = "llama-3.1-8b"


def budget(value: str | float, flag: str) -> float:
    """False flags allowed per run: a number, 0 or more (0: none in 95% of healthy runs)."""
    return units.parse_number(value, what=flag, example="1", minimum=0.0)


def fraction(value: object, flag: str) -> float:
    """A share of the median: 0 or more and below 1 (5% is 0.05)."""
    raw = str(value).strip()
    try:
        number = units.parse_number(raw.removesuffix("%"), what=flag, example="0.05", minimum=0.0,
                                    maximum=100.0 if raw.endswith("%") else 1.0, allow_maximum=False)
    except UsageError:
        raise UsageError(f"invalid {flag} {value!r}: expected a share of the median from 0 to below 1 (or a "
                         f"percentage), e.g. {flag} 0.05 or {flag} 5%") from None
    return number / 100.0 if raw.endswith("%") else number


@dataclass
class Config:
    # The places of records: filled from the command's positional arguments.
    sources: list[str] = field(default_factory=list)
    hosts: str | None = option(
        None,
        parse=text,
        metavar="FILE",
        help="the nodes expected, one name a line (# comments): a node without records is MISSING",
    )
    accept: str | None = option(None, parse=text, metavar="THRESHOLDS",
                                help="acceptance floors (TOML or JSON, as `suite --accept`), held per node; most of a "
                                     "group below one floor is one fleet-wide finding")
    budget: float = option(1.0, parse=budget, metavar="FLAGS", shown="1",
                           help="false flags allowed per run over nodes x metrics; k is set so that a healthy fleet "
                                "stays within it in 95%% of runs")
    min_fraction: float = option(0.05, parse=fraction, metavar="SHARE",
                                 help="flag a node only when it is at least this much worse than its group's median")
    endpoint: str | None = option(None, parse=text, metavar="URL",
                                  help="S3 endpoint for s3:// sources (credentials from the AWS chain; default AWS)")
    model: str = option(DEFAULT_MODEL, parse=text,
                        help="the model whose step (or checkpoint save) the composer prices each failed node in")
    json: str | None = option(None, parse=text, metavar="PATH", record=False,
                              help="the fleet record (default: results/fleet-TIME.json)")
    results_dir: str = option("results", parse=text, metavar="DIR", record=False,
                              help="where the fleet record goes without --json")
    junit: str | None = option(None, parse=text, metavar="PATH", record=False,
                               help="also write JUnit XML: a testsuite per node, a testcase per metric")
    drain: str | None = option(None, parse=text, metavar="PATH", record=False,
                               help="the nodes to drain, one a line (default: beside the record, .drain.txt); "
                                    "written, never acted on")
    rerun: str | None = option(None, parse=text, metavar="PATH", record=False,
                               help="the nodes to run again, one a line (default: beside the record, .rerun.txt)")
