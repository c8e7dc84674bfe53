"""The whole job as a timeline: load the model, train N steps with their data stall, checkpoint
every K steps (the part the loop waits for, then the drain until durable, overlapping the next
steps), and a final save that must be durable before the job counts as done.

Pure arithmetic over per-phase costs in seconds. Where the costs come from (a predicted step, a
tier's bandwidth, a mount's write-back, a measured run) is the caller's business, so the same
timeline serves `compose` (predicted costs) and `verify job` (the prediction it is checked
against). Kinds name what a phase is; only phases on the critical path (not `overlapped`) add
to the total.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from ...core.errors import UsageError

# Phase kinds, in the order a report shows them (the colours of the timeline picture).
KINDS = ("model_load", "train", "data_stall", "ckpt_blocking", "ckpt_wait", "ckpt_drain", "final_save")
IO_KINDS = ("model_load", "data_stall", "ckpt_blocking", "ckpt_wait", "final_save")


@dataclass(frozen=True)
class JobPlan:
    steps: int
    ckpt_every: int | None = None  # steps between checkpoints; None: only the final save
    async_ckpt: bool = False
    final_save: bool = True
    tokens_per_step: int = 0

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise UsageError(f"--steps {self.steps}: a job trains at least one step, e.g. --steps 80")
        if self.ckpt_every is not None and self.ckpt_every < 1:
            raise UsageError(f"--ckpt-every {self.ckpt_every}: expected a number of steps >= 1, e.g. --ckpt-every 5")


@dataclass(frozen=True)
class PhaseCosts:
    """What each phase costs, in seconds. save_blocking_s: what the training loop waits for at each
    checkpoint (the whole save when it is synchronous to a direct tier; the staging copy when it is
    async; the cache write on a cached mount). save_drain_s: from there until the checkpoint is
    durable, overlapping training. drain_blocks_next: the next save waits for the previous drain
    (an async DCP save does: torch waits on the previous future); a mount's write-back does not,
    it queues (compose/checkpoint/mount.py says when that backlog grows)."""

    model_load_s: float
    step_s: float
    data_stall_s: float = 0.0  # per step, on top of step_s (0 when the loader keeps up)
    save_blocking_s: float = 0.0
    save_drain_s: float = 0.0
    drain_blocks_next: bool = True
    # The part of save_drain_s that is a fixed wait before the upload starts (a cached mount's
    # write-back delay): each checkpoint's runs on its own clock, only the uploads queue behind
    # each other. 0: the whole drain queues (an upload at the bucket's bandwidth).
    drain_delay_s: float = 0.0

    def __post_init__(self) -> None:
        for key, value in asdict(self).items():
            if isinstance(value, float) and not (math.isfinite(value) and value >= 0):
                raise ValueError(f"PhaseCosts.{key} = {value!r}: expected a finite time >= 0 s")


@dataclass(frozen=True)
class Phase:
    name: str
    kind: str
    start_s: float
    time_s: float
    overlapped: bool = False  # runs beside training, not on the critical path


@dataclass(frozen=True)
class JobTimeline:
    plan: JobPlan
    costs: PhaseCosts
    phases: tuple[Phase, ...]
    total_s: float

    def time_by_kind(self) -> dict[str, float]:
        """Critical-path seconds per kind (overlapped drains are not counted: they cost no time)."""
        out = {k: 0.0 for k in KINDS}
        for p in self.phases:
            if not p.overlapped:
                out[p.kind] += p.time_s
        return out

    def share_by_kind(self) -> dict[str, float]:
        by_kind = self.time_by_kind()
        return {k: (v / self.total_s if self.total_s > 0 else 0.0) for k, v in by_kind.items()}

    @property
    def io_share(self) -> float:
        """The share of the job not spent training: "% of training time on I/O"."""
        share = self.share_by_kind()
        return sum(share[k] for k in IO_KINDS)

    @property
    def tokens_per_s(self) -> float:
        return self.plan.steps * self.plan.tokens_per_step / self.total_s if self.total_s > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "plan": asdict(self.plan),
            "costs": asdict(self.costs),
            "total_s": self.total_s,
            "tokens_per_s": self.tokens_per_s,
            "io_share": self.io_share,
            "time_by_kind_s": self.time_by_kind(),
            "share_by_kind": self.share_by_kind(),
            "phases": [asdict(p) for p in self.phases],
        }


def checkpoint_steps(plan: JobPlan) -> list[int]:
    """The steps after which a periodic checkpoint is taken; one at the last step is the final
    save's (not taken twice)."""
    if plan.ckpt_every is None:
        return []
    return [s for s in range(plan.ckpt_every, plan.steps, plan.ckpt_every)]


def timeline(plan: JobPlan, costs: PhaseCosts) -> JobTimeline:
    phases: list[Phase] = []
    t = 0.0

    def add(name: str, kind: str, time_s: float, overlapped: bool = False) -> None:
        nonlocal t
        if time_s <= 0:
            return
        phases.append(Phase(name, kind, t, time_s, overlapped))
        if not overlapped:
            t += time_s

    add("model load", "model_load", costs.model_load_s)
    drain_ends_at = 0.0  # when the last checkpoint's drain finishes (durable)
    done = 0
    marks = checkpoint_steps(plan) + [plan.steps]
    for n, until in enumerate(marks, start=1):
        count = until - done
        first = done + 1
        label = f"steps {first}-{until}" if count > 1 else f"step {until}"
        add(label, "train", count * costs.step_s)
        add(f"data stall, {label}", "data_stall", count * costs.data_stall_s)
        done = until
        final = until == plan.steps
        if final and not plan.final_save:
            break
        if costs.drain_blocks_next and drain_ends_at > t:
            add(f"wait for checkpoint {n - 1} to be durable", "ckpt_wait", drain_ends_at - t)
        delay = min(costs.drain_delay_s, costs.save_drain_s)
        upload = costs.save_drain_s - delay
        if final:
            # The job ends when its last checkpoint is durable: nothing left to overlap with. A
            # queued write-back uploads the earlier checkpoints first.
            queued = max(0.0, drain_ends_at - t - costs.save_blocking_s - delay)
            add("final save until durable", "final_save", costs.save_blocking_s + queued + costs.save_drain_s)
            break
        add(f"checkpoint {n} (blocking)", "ckpt_blocking", costs.save_blocking_s)
        if costs.save_drain_s > 0:
            # A queued write-back starts after the earlier uploads (one bucket bandwidth); its
            # delay, if any, runs beside them.
            start = max(t + delay, drain_ends_at)
            phases.append(
                Phase(f"checkpoint {n} drain until durable", "ckpt_drain", start - delay, costs.save_drain_s, True)
            )
            drain_ends_at = start + upload
    return JobTimeline(plan, costs, tuple(phases), t)


def steps_for_tokens(tokens: int, tokens_per_step: int) -> int:
    """--tokens to a number of steps (the last step may pass the target)."""
    if tokens_per_step <= 0:
        raise ValueError(f"tokens_per_step = {tokens_per_step}: expected > 0")
    return max(1, math.ceil(tokens / tokens_per_step))


def every_for_interval(interval_s: float, step_s: float, save_s: float) -> int:
    """--ckpt-interval (a time) to --ckpt-every (steps). A save that takes longer than the interval
    leaves no time to train: that is misuse, refused with the numbers."""
    if save_s >= interval_s:
        raise UsageError(
            f"--ckpt-interval {interval_s:g} s is shorter than one save ({save_s:.3g} s): the job would "
            f"never train; give an interval longer than the save, e.g. --ckpt-interval "
            f"{max(60, math.ceil(save_s * 10)):g}s"
        )
    if step_s <= 0:
        raise ValueError(f"step_s = {step_s}: expected > 0")
    return max(1, int((interval_s - save_s) // step_s))
