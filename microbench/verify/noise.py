"""Verdicts that know the noise: PASS or FAIL only when the measurement can tell, INCONCLUSIVE when
noise alone could move a row across its tolerance.

A row's error comes from repeated readings: a step or a save is measured several times, each
against the prediction from the probes read right before it, and the row's error is the median
of those paired errors. Two things can move it without the prediction being wrong:

1. The readings' own scatter. The median of n readings lies, with a known probability whatever
   their distribution, between two of them: the j-th smallest and the j-th largest cover it with
   probability 1 - 2 P(Bin(n, 1/2) <= j - 1). The interval used is the narrowest such pair that
   covers it with at least CONFIDENCE (with too few readings for that, the smallest to the
   largest, and its own lower coverage).
2. The rest of the machine. While other processes take a share u of the CPUs, either side of a
   pair, the prediction's probes or the real step, can have been slowed by up to 1 / (1 - u)
   without the other: a true error e reads anywhere from (1 + e)(1 - u) - 1 to (1 + e) / (1 - u)
   - 1. The interval is widened by that much (world/load.py measures u for each phase).

PASS when the whole widened interval is within the tolerance, FAIL when it lies wholly outside,
INCONCLUSIVE otherwise: then the row says how wide the noise was, what load the machine had, and
how to get a clean verdict. A miss so large that no noise explains it (a wrong calibration) is
still FAIL on a busy machine; a row well inside the tolerance is still PASS on one."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..core.errors import Inconclusive, RunError

CONFIDENCE = 0.90
PASS, FAIL, INCONCLUSIVE = "PASS", "FAIL", "INCONCLUSIVE"
RULE = ("each row's error with the order-statistic interval of its paired readings' median (>= 90% coverage), "
        "widened by the CPU share other processes took (either side slowed by up to 1/(1-share)): PASS inside "
        "the tolerance, FAIL wholly outside it, INCONCLUSIVE across it")


def coverage(n: int, j: int) -> float:
    """P(x_(j) <= median <= x_(n+1-j)) for n independent readings, whatever their distribution."""
    below = sum(math.comb(n, k) for k in range(j)) / 2 ** n
    return 1.0 - 2.0 * below


def median_interval(values: list[float], confidence: float = CONFIDENCE) -> tuple[float, float, float]:
    """(low, high, coverage): the narrowest order-statistic interval around the median of `values`
    that covers it with at least `confidence`, else the smallest to the largest value."""
    xs = sorted(values)
    n = len(xs)
    if n == 0:
        raise ValueError("no readings")
    best = 1
    for j in range(1, n // 2 + 1):
        if coverage(n, j) >= confidence:
            best = j
    return xs[best - 1], xs[n - best], coverage(n, best)


def widened(low_pct: float, high_pct: float, other_share: float | None) -> tuple[float, float]:
    """The interval of an error (percent) once either side may have been slowed by the share of
    the CPUs other processes took."""
    u = min(max(other_share or 0.0, 0.0), 0.95)
    return (100.0 * ((1 + low_pct / 100.0) * (1 - u) - 1), 100.0 * ((1 + high_pct / 100.0) / (1 - u) - 1))


def error_pct(predicted: float, measured: float) -> float:
    return 100.0 * (predicted - measured) / measured


@dataclass(frozen=True)
class Judgement:
    verdict: str
    error_pct: float
    readings: int
    interval_pct: tuple[float, float]     # the readings' own (coverage below)
    coverage: float
    band_pct: tuple[float, float]         # widened by the load
    load: dict[str, Any] | None

    def as_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "error_pct": self.error_pct, "readings": self.readings,
                "interval_pct": list(self.interval_pct), "coverage": self.coverage, "band_pct": list(self.band_pct),
                "other_share": (self.load or {}).get("other_share"), "loadavg_1m": (self.load or {}).get("loadavg_1m")}


def judge(errors_pct: list[float], error: float, tolerance_pct: float, load: dict[str, Any] | None) -> Judgement:
    """The verdict of a row whose error (percent) is the median of its paired errors."""
    low, high, cov = median_interval(errors_pct)
    return judge_interval(error, low, high, cov, len(errors_pct), tolerance_pct, load)


def judge_interval(error: float, low: float, high: float, cov: float, readings: int, tolerance_pct: float,
                   load: dict[str, Any] | None) -> Judgement:
    """The verdict of a row's error (percent) whose readings put it within low..high."""
    low, high = min(low, error), max(high, error)
    band = widened(low, high, (load or {}).get("other_share"))
    if -tolerance_pct <= band[0] and band[1] <= tolerance_pct:
        verdict = PASS
    elif band[0] > tolerance_pct or band[1] < -tolerance_pct:
        verdict = FAIL
    else:
        verdict = INCONCLUSIVE
    return Judgement(verdict, error, readings, (low, high), cov, band, load)


def paired(predicted_each: list[float] | None, measured_each: list[float] | None, error: float) -> list[float]:
    """The paired errors of a row's readings; a row without them (older records) has its error alone."""
    if predicted_each and measured_each and len(predicted_each) == len(measured_each):
        return [error_pct(p, m) for p, m in zip(predicted_each, measured_each, strict=False) if m > 0]
    return [error]


def load_text(load: dict[str, Any] | None) -> str:
    if not load or load.get("other_share") is None:
        return "the load during it is unknown"
    text = f"other processes took {load['other_cpus']:.2f} of {load['cpus']} CPUs ({100 * load['other_share']:.0f}%)"
    if load.get("loadavg_1m") is not None:
        text += f", load average {load['loadavg_1m']:.2f}"
    return text


def why(j: Judgement, tolerance_pct: float) -> str:
    """What an INCONCLUSIVE row says: the spread of its readings and the load it saw."""
    low, high = j.interval_pct
    return (f"error {j.error_pct:+.1f}%; its {j.readings} readings put it at {low:+.1f}..{high:+.1f}% "
            f"({100 * j.coverage:.0f}% coverage) and the load ({load_text(j.load)}) at "
            f"{j.band_pct[0]:+.1f}..{j.band_pct[1]:+.1f}%, across the +-{tolerance_pct:g}% tolerance")


def how_to_get_clean(judgements: list[Judgement]) -> str:
    shares = [(j.load or {}).get("other_share") or 0.0 for j in judgements]
    if max(shares, default=0.0) >= 0.05:
        return ("rerun when the machine is quiet (other processes took up to "
                f"{max(shares) * 100:.0f}% of the CPUs during this run), or with more "
                "--steps (--ckpt-reps for checkpoints) to narrow the readings")
    return "rerun with more --steps (--ckpt-reps for checkpoints) to narrow the readings"


def exit_for(verdict: dict[str, Any], path: Any) -> int:
    """0 on PASS; RunError (exit 1) naming every configuration outside; Inconclusive (exit 3)
    naming every one noise could have moved, and how to get a clean verdict."""
    outside = verdict["outside"]
    if outside:
        raise RunError(f"{len(outside)} configuration(s) outside the tolerance: {'; '.join(outside)} "
                       f"(every row is in {path})")
    unsure = verdict.get("inconclusive") or []
    if unsure:
        names = "; ".join(line.split(": ", 1)[0] for line in unsure)
        raise Inconclusive(f"{len(unsure)} configuration(s) inconclusive, noise alone could move them across the "
                           f"tolerance: {names}; {verdict.get('clean')} (every row and its noise is in {path})")
    return 0


# --------------------------------------------------------------------------- the report

def cells(part: dict[str, Any], tolerance_pct: float) -> tuple[str, str]:
    """(verdict, noise band) as the tables show them: the judgement the verdict attached to the
    row, else (a row from before it) the error against the tolerance alone."""
    judged = part.get("noise")
    if not judged:
        return ("ok" if abs(part["error_pct"]) <= tolerance_pct else "OUTSIDE"), "-"
    shown = {PASS: "ok", FAIL: "OUTSIDE"}.get(judged["verdict"], judged["verdict"])
    low, high = judged["band_pct"]
    return shown, f"{low:+.0f}..{high:+.0f}%"


def print_verdict(verdict_: dict[str, Any], tolerances: str, checked: str = "checked") -> None:
    """The closing lines: each inconclusive row's noise and load, how to get a clean verdict, the verdict."""
    unsure = verdict_.get("inconclusive") or []
    if verdict_.get("rows"):
        print("# with noise: where the error may lie given its readings' spread (median interval, >= 90%) and "
              "the CPU share other processes took meanwhile; PASS needs it inside the tolerance, FAIL wholly outside")
    for line in unsure:
        print(f"# inconclusive: {line}")
    if verdict_.get("clean"):
        print(f"# for a clean verdict: {verdict_['clean']}")
    shown = verdict_.get("verdict") or ("PASS" if verdict_["pass"] else "FAIL")
    print(f"# verdict: {shown} ({verdict_['checked']} {checked}, {len(verdict_['outside'])} outside"
          f"{f', {len(unsure)} inconclusive' if unsure else ''} {tolerances})")
