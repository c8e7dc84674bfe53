"""Every network x every storage assignment per phase, each a job timeline (compose/job/timeline.py),
ranked by total; the recommendation under the durability constraint and how much faster each
phase's tier would have to be to change it.

The constraint: a restart must find the last checkpoint on durable storage and load the model
from there, so an assignment is recommended only when its checkpoint tier is durable and the
model comes from the checkpoint's tier (`--model-from` is where a restart resumes). Others are
ranked too, marked, never recommended. A configuration whose --ckpt-interval is shorter than its
save never trains: shown as such (refused when that tier was named with --ckpt-to).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any

from ...core.errors import UsageError
from ..dataload import DataRate, ModelLoad, data_stall
from .assignment import PHASES, Assignment
from .inputs import CkptTarget, JobAsk, scaled_rate
from .timeline import JobPlan, JobTimeline, PhaseCosts, every_for_interval, timeline

MAX_FACTOR = 100.0
_SAME = 1e-9     # relative: totals closer than this are a tie


def total_s(plan: JobPlan, costs: PhaseCosts) -> float:
    """compose/job.timeline(plan, costs).total_s in closed form, without building the phases: a
    what-if ranks hundreds of configurations and bisects on them, and a long job has thousands of
    checkpoints (tests/test_compose_job_whatif.py holds it equal to the timeline's).

    Periods of P = every x (step + stall) end in a save blocking b with a drain d after it. When the
    next save waits for the drain, each period after the first lasts max(P, d) + b. When drains
    queue (a mount's write-back: a fixed delay w beside the earlier uploads, then the upload u = d - w),
    the last one ends at the later of the first save + w + n x u and the last save + d. The final
    save lasts until durable: max(t + b + w, last drain's end) + u."""
    step = costs.step_s + costs.data_stall_s
    b, d = costs.save_blocking_s, costs.save_drain_s
    delay = min(costs.drain_delay_s, d)     # a write-back's fixed wait, beside the earlier uploads
    u = d - delay
    n = (plan.steps - 1) // plan.ckpt_every if plan.ckpt_every else 0
    load = costs.model_load_s
    period = plan.ckpt_every * step if plan.ckpt_every else 0.0
    drain_end = 0.0
    if n == 0:
        t = load
    elif costs.drain_blocks_next:
        t = load + period + b + (n - 1) * (max(period, d) + b)
        drain_end = t + d if d > 0 else 0.0
    else:
        t = load + n * (period + b)
        drain_end = max(load + period + b + delay + n * u, t + delay + u) if d > 0 else 0.0
    t += (plan.steps - n * (plan.ckpt_every or 0)) * step
    if not plan.final_save:
        return t
    if costs.drain_blocks_next:
        t = max(t, drain_end)
        return max(t + b, drain_end) + d
    return max(t + b + delay, drain_end) + u


@functools.lru_cache(maxsize=4096)
def _timeline(plan: JobPlan, costs: PhaseCosts) -> JobTimeline:
    return timeline(plan, costs)


@dataclass
class Outcome:
    config: Assignment
    plan: JobPlan | None                # None: never trains
    costs: PhaseCosts | None
    total_s: float                      # inf: never trains
    ckpt_every: int | None
    marks: tuple[str, ...]
    never: str | None = None
    tie: tuple[float, ...] = ()         # tie-breakers: more headroom first (loader, load, save)

    @property
    def allowed(self) -> bool:
        return not self.marks and self.never is None

    @property
    def timeline(self) -> JobTimeline | None:
        """The phases, built when shown or recorded (the ranking needs only the total)."""
        return None if self.plan is None or self.costs is None else _timeline(self.plan, self.costs)

    @property
    def tokens_per_s(self) -> float | None:
        ok = self.plan is not None and math.isfinite(self.total_s) and self.total_s > 0
        return self.plan.steps * self.plan.tokens_per_step / self.total_s if ok and self.plan else None

    @property
    def io_share(self) -> float | None:
        """Everything but the training steps themselves (compose/job.IO_KINDS)."""
        if self.plan is None or self.costs is None or not self.total_s > 0 or not math.isfinite(self.total_s):
            return None
        return 1 - self.plan.steps * self.costs.step_s / self.total_s

    def key(self) -> tuple[float, ...]:
        return (self.total_s, *self.tie)


@dataclass
class JobModel:
    ask: JobAsk
    step_s: dict[str, float]            # network -> predicted step
    samples_per_step: int               # per rank
    data: dict[str, DataRate]
    models: dict[str, ModelLoad]
    ckpt: dict[str, dict[str, CkptTarget]]   # network -> tier -> target
    interval_s: float
    choices: dict[str, list[str]]       # phase -> candidate names
    named_ckpt: bool                    # --ckpt-to was given: a configuration that never trains is misuse

    def configs(self) -> list[Assignment]:
        return [Assignment(d, m, c, n) for n in self.step_s for d in self.choices["data"]
                for m in self.choices["model_from"] for c in self.choices["ckpt_to"]]

    def marks(self, cfg: Assignment) -> tuple[str, ...]:
        target = self.ckpt[cfg.network][cfg.ckpt_to]
        out = []
        if not target.durable:
            out.append("ephemeral checkpoint")
        if cfg.model_from != cfg.ckpt_to:
            out.append(f"resumes from {cfg.model_from}, not {cfg.ckpt_to}")
        return tuple(out)

    def evaluate(self, cfg: Assignment, scale: tuple[str, str, float] | None = None) -> Outcome:
        """One configuration; scale = (phase, tier, factor): that phase's tier that much faster."""
        def f(phase: str) -> float:
            return scale[2] if scale and scale[0] == phase and scale[1] == getattr(cfg, phase) else 1.0

        step = self.step_s[cfg.network]
        rate = scaled_rate(self.data[cfg.data], f("data"))
        stall = data_stall(rate, self.samples_per_step, step, cfg.network)
        load_s = self.models[cfg.model_from].load_s / f("model_from")
        blocking, drain, blocks_next, delay = self.ckpt[cfg.network][cfg.ckpt_to].costs(f("ckpt_to"))
        every, never = self.ask.ckpt_every, None
        if every is None:
            try:
                every = every_for_interval(self.interval_s, step + stall.stall_s, blocking)
            except UsageError as e:
                if self.named_ckpt:
                    raise UsageError(f"--ckpt-to {cfg.ckpt_to} on {cfg.network}: {e}") from None
                never = str(e)
        marks = self.marks(cfg)
        tie = (stall.loader_s, load_s, blocking + drain)
        if never is not None:
            return Outcome(cfg, None, None, math.inf, None, marks, never, tie)
        costs = PhaseCosts(load_s, step, stall.stall_s, blocking, drain, blocks_next, delay)
        plan = self.ask.plan(every)
        return Outcome(cfg, plan, costs, total_s(plan, costs), every, marks, None, tie)


@dataclass
class Flip:
    phase: str
    recommended: str
    alternative: str | None
    factor: float | None                # None: no change up to MAX_FACTOR
    ties: list[str] = field(default_factory=list)


@dataclass
class WhatIf:
    outcomes: list[Outcome]             # sorted by total
    best: Outcome | None                # the recommendation (allowed); None when nothing is
    worst: Outcome | None               # the slowest allowed
    flips: list[Flip]

    @property
    def end_to_end(self) -> float | None:
        if self.best is None or self.worst is None or not self.best.total_s > 0:
            return None
        return self.worst.total_s / self.best.total_s

    def base_s(self) -> float:
        finite = [o.total_s for o in self.outcomes if math.isfinite(o.total_s)]
        return self.best.total_s if self.best else min(finite, default=math.nan)


def _same(a: float, b: float) -> bool:
    return abs(a - b) <= _SAME * max(abs(a), abs(b), 1e-30)


def _cheapest_total(model: JobModel, cands: list[Assignment], phase: str, alt: str, factor: float) -> float:
    """The best total of `cands` with `alt`'s bandwidth for `phase` scaled by `factor`."""
    return min(model.evaluate(c, (phase, alt, factor)).total_s for c in cands)


def _flip(model: JobModel, best: Outcome, phase: str, allowed: list[Assignment]) -> Flip:
    """The least factor on one alternative tier's bandwidth (for this phase) at which a
    configuration using it beats the recommendation."""
    rec = getattr(best.config, phase)
    found: tuple[float, str] | None = None
    ties = []
    for alt in model.choices[phase]:
        if alt == rec:
            continue
        cands = [c for c in allowed if getattr(c, phase) == alt]
        if not cands:
            continue
        g = functools.partial(_cheapest_total, model, cands, phase, alt)

        if _same(g(1.0), best.total_s):
            ties.append(alt)
            continue
        if not g(MAX_FACTOR) < best.total_s * (1 - _SAME):
            continue
        lo, hi = 1.0, MAX_FACTOR
        for _ in range(16):             # on a log scale: 100^(1/65536), far below what is printed
            mid = math.sqrt(lo * hi)
            lo, hi = (lo, mid) if g(mid) < best.total_s * (1 - _SAME) else (mid, hi)
        if found is None or hi < found[0]:
            found = (hi, alt)
    return Flip(phase, rec, found[1] if found else None, found[0] if found else None, ties)


def whatif(model: JobModel) -> WhatIf:
    outcomes = sorted((model.evaluate(c) for c in model.configs()), key=Outcome.key)
    if not any(math.isfinite(o.total_s) for o in outcomes):
        raise UsageError(f"no configuration ever trains: {outcomes[0].never}")
    allowed = [o for o in outcomes if o.allowed]
    best = allowed[0] if allowed else None
    worst = allowed[-1] if allowed else None
    flips = []
    if best is not None:
        cands = [o.config for o in outcomes if not o.marks]
        flips = [_flip(model, best, phase, cands) for phase in PHASES]
    return WhatIf(outcomes, best, worst, flips)


def rows(result: WhatIf) -> list[dict[str, Any]]:
    """The ranked what-if as record rows (op "job"), ratio to the recommendation."""
    base = result.base_s()
    out = []
    for rank, o in enumerate(result.outcomes, start=1):
        finite = math.isfinite(o.total_s)
        out.append({"op": "job", "rank": rank, "network": o.config.network, "data": o.config.data,
                    "model_from": o.config.model_from, "ckpt_to": o.config.ckpt_to, "total_s": o.total_s
                    if finite else None, "ratio": o.total_s / base if finite and base > 0 else None,
                    "tokens_per_s": o.tokens_per_s, "io_share": o.io_share,
                    "ckpt_every": o.ckpt_every, "allowed": o.allowed, "recommended": o is result.best,
                    "marks": "; ".join(o.marks), "never_trains": o.never})
    return out
