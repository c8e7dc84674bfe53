"""Calibration from one measured step: the one scale on every compute rate (matmul, attention,
memory-bound, FSDP copies alike) with which the composer reproduces a step a trainer measured
on a described configuration, and its use on other configurations of the same GPU kind (more
nodes, another network, micro-batch or checkpointing). Communication is not scaled: it stays
with the network inputs.

The step is not linear in the scale where communication hides behind compute in some units and
not others, so the scale is found by bisection (the step falls monotonically as the scale
rises). A measured step the configuration's communication, optimizer and FSDP overhead alone
exceed cannot be reproduced by any compute rate: refused, naming both.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

from ...core.errors import UsageError

SCALE_RANGE = (1e-3, 1e3)


@dataclass(frozen=True)
class ComputeCalibration:
    scale: float  # multiplies every compute rate
    gpu: str  # the GPU kind it was measured on
    measured_step_s: float
    predicted_unscaled_s: float  # the step the described rates gave
    configuration: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        return {
            "compute_scale": self.scale,
            "gpu": self.gpu,
            "measured_step_s": self.measured_step_s,
            "predicted_unscaled_s": self.predicted_unscaled_s,
            "configuration": self.configuration,
        }


def check_measured_step(value: Any, what: str = "--measured-step") -> float:
    """A measured step in seconds: positive and finite (0, negatives, NaN, inf refused)."""
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = math.nan
    if isinstance(value, bool) or not (math.isfinite(seconds) and seconds > 0):
        raise UsageError(
            f"invalid {what} {value!r}: expected the seconds one optimizer step took, positive and "
            f"finite, e.g. {what} 2.8"
        )
    return seconds


def solve_scale(measured_s: float, step_at: Callable[[float], float]) -> float:
    """The scale s at which step_at(s) == measured_s (step_at falls as s rises)."""
    lo, hi = SCALE_RANGE
    slow, fast = step_at(lo), step_at(hi)
    if measured_s >= slow:
        return lo
    if measured_s <= fast:
        raise UsageError(
            f"the measured step {measured_s:.4g} s is shorter than this configuration's communication, "
            f"optimizer and FSDP overhead alone ({fast:.4g} s at any compute rate): it was not measured "
            f"on this configuration (check --nodes, --micro-batch, --seq-len, the networks)"
        )
    for _ in range(80):
        mid = math.sqrt(lo * hi)
        if step_at(mid) > measured_s:
            lo = mid
        else:
            hi = mid
        if hi / lo < 1 + 1e-9:
            break
    return math.sqrt(lo * hi)


def calibrate(
    measured_s: float, gpu: str, configuration: dict[str, Any], step_at: Callable[[float], float]
) -> ComputeCalibration:
    measured_s = check_measured_step(measured_s)
    return ComputeCalibration(solve_scale(measured_s, step_at), gpu, measured_s, step_at(1.0), configuration)


def calibrate_step(
    measured_s: float, gpu: str, configuration: dict[str, Any], model: Any, train: Any, network: Any
) -> ComputeCalibration:
    """The scale with which `train` (priced per kernel) over `network` steps in `measured_s`:
    compose --measured-step and the published-runs check both calibrate through this."""
    from dataclasses import replace

    from ..fsdp import predict_step

    def step_at(scale: float) -> float:
        return predict_step(
            model, replace(train, compute_scale=scale), network.all_gather, network.reduce_scatter
        ).step_s

    return calibrate(measured_s, gpu, configuration, step_at)


def read_calibration(summary_calibration: Any, source: str) -> ComputeCalibration:
    """The compute calibration a compose record keeps under summary.calibration."""
    cal = summary_calibration if isinstance(summary_calibration, dict) else {}
    scale = cal.get("compute_scale")
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not (math.isfinite(scale) and scale > 0):
        raise UsageError(
            f"--calibration {source!r} has no compute scale (summary.calibration.compute_scale); "
            f"expected a record of `microbench compose ... --measured-step SECONDS`"
        )
    gpu = cal.get("gpu")
    if not isinstance(gpu, str) or not gpu:
        raise UsageError(
            f"--calibration {source!r} does not say which GPU it was measured on "
            f"(summary.calibration.gpu); re-run `microbench compose --gpu NAME --measured-step SECONDS`"
        )
    measured = check_measured_step(cal.get("measured_step_s"), f"--calibration {source} measured_step_s")
    return ComputeCalibration(
        float(scale), gpu, measured, float(cal.get("predicted_unscaled_s") or 0.0), dict(cal.get("configuration") or {})
    )


def check_gpu(calibration: ComputeCalibration, target_gpu: str | None, source: str) -> None:
    """A scale measured on one GPU kind says nothing of another's kernels: refused, naming both."""
    if target_gpu is None:
        raise UsageError(
            f"--calibration {source!r} was measured on {calibration.gpu}; name the GPU it applies to "
            f"with --gpu {calibration.gpu}"
        )
    if target_gpu.lower() != calibration.gpu.lower():
        raise UsageError(
            f"--calibration {source!r} was measured on {calibration.gpu}, not on --gpu {target_gpu}: "
            f"a compute scale does not carry across GPU kinds; measure a step on {target_gpu}"
        )
