"""The flags `verify fsdp` and `verify job` share, declared once as sections (core/sections.py):
where the ranks run (Ranks), the calibration the prediction uses (Calibrating) and where the
record goes (Output). Each command adds its own sections (verify/fsdp/options.py,
verify/job/options.py); a default that differs between them (job's longer --timeout) is the
one field its subclass declares again, with the same help."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar

from ..core.errors import UsageError
from ..core.options import option, positive_int, timeout
from ..core.units import format_link_rate, parse_link_rate, parse_number, parse_positive_int

TIMEOUT_HELP = "seconds before a silent peer fails the run"
Profiles = list[tuple[str, int | None]]  # (label, egress rate in bit/s or None for unshaped)


def whole(example: str) -> Callable[[Any, str], int]:
    """A positive whole number, refused with this flag's own example."""
    return lambda text, flag: parse_positive_int(text, what=flag, example=example)


def tolerance(example: str) -> Callable[[Any, str], float]:
    """Largest |error| in percent: more than 0, at most 1000."""
    return lambda text, flag: parse_number(
        text, what=flag, example=example, minimum=0, allow_minimum=False, maximum=1000
    )


def link_profiles(text: Any, flag: str) -> Profiles:
    labels = [p.strip() for p in str(text).split(",") if p.strip()]
    if not labels:
        raise UsageError(f"invalid {flag} {text!r}: expected rates, e.g. unlimited,1gbit")
    out: Profiles = []
    for label in labels:
        try:
            out.append((format_link_rate(parse_link_rate(label)), parse_link_rate(label)))
        except UsageError:
            raise UsageError(
                f"unknown link profile {label!r} in {flag}: expected unlimited or a rate in "
                f"bit/kbit/mbit/gbit, e.g. {flag} unlimited,1gbit"
            ) from None
    return out


def cal_reps(text: Any, flag: str) -> int:
    reps = parse_positive_int(text, what=flag, example="9")
    if reps < 3:
        raise UsageError(
            f"invalid {flag} {text!r}: each calibration number is a median with its middle half "
            f"beside it, which needs at least 3 readings, e.g. {flag} 9"
        )
    return reps


@dataclass
class Ranks:
    TITLE: ClassVar[str] = "ranks"
    DESCRIPTION: ClassVar[str] = "where the ranks run: local ranks on loopback, or a lab's hosts and its links"
    nproc: int | None = option(
        None, parse=positive_int, shown="GPUs, else 2; the lab's hosts", help="local ranks when not launched"
    )
    backend: str = option("auto", help="auto, nccl or gloo")
    lab: str | None = option(
        None,
        metavar="NAME",
        shown="none: local ranks on loopback",
        help="run the ranks on this lab's hosts, the lab's ranks per host on each",
    )
    link_profiles: Profiles | None = option(
        None,
        parse=link_profiles,
        metavar="RATES",
        shown="none: the links as they are",
        help="with --lab: every configuration under each egress rate, e.g. unlimited,1gbit",
    )
    timeout_s: float = option(120, flag="--timeout", metavar="SECONDS", parse=timeout, help=TIMEOUT_HELP)

    def check(self) -> None:
        if self.link_profiles is not None and not self.lab:
            raise UsageError(
                "--link-profiles needs --lab NAME: it reshapes the lab's links between profiles, "
                "e.g. --lab v --link-profiles unlimited,1gbit"
            )

    def profiles(self) -> Profiles:
        """The link profiles to run: as given, else the link as it is."""
        return self.link_profiles or [("unlimited" if self.lab else "loopback", None)]


@dataclass
class Calibrating:
    TITLE: ClassVar[str] = "calibration"
    DESCRIPTION: ClassVar[str] = (
        "the overlap, FSDP's per-unit cost and the compute efficiency the prediction takes beside the probes"
    )
    calibration: str | None = option(
        None,
        metavar="RECORD",
        shown="none: calibrate in this run",
        help="use this `verify fsdp --calibrate-only` record instead of calibrating "
        "now (same backend and model family)",
    )
    cal_reps: int | None = option(
        None,
        parse=cal_reps,
        metavar="N",
        shown="15 for FSDP's per-unit cost, 9 for the overlap and the compute efficiency",
        help="timed steps (or pairs) behind each calibration number; fewer is quicker and noisier (at least 3)",
    )


@dataclass
class Output:
    TITLE: ClassVar[str] = "output"
    json: str | None = option(
        None, metavar="PATH", record=False, shown="a new file in --results-dir", help="write the record here"
    )
    results_dir: str = option("results", metavar="DIR", record=False, help="where records go without --json")
