"""What a measurement says that the composer cannot know from probes alone. One type, read by
compose (--calibration) and produced and used by verify, or made by compose --measured-step.

From `verify fsdp --calibrate-only`, FSDP on one backend and device:
  overlap             where a real step sits between the serial sum of its parts (0) and the
                      pipelined step (1);
  unit_overhead_s     FSDP's own cost per unit per pass (hooks, copy-in/out), never hidden;
  compute_efficiency  the compute probe's kernels' time over the model's real forward+backward
                      (the share the norms, activations and the loss do not add).
From `compose --measured-step` (kernels/calibration.py), one step a trainer measured on a GPU:
  compute_scale       the one scale on every compute rate that reproduces it; `gpu` the kind it
                      was measured on (another kind is refused, naming both).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..core.errors import UsageError
from ..core.units import parse_number

# Each number's range as a record may hold it: past these it is a corrupted file, not a measurement.
BOUNDS = (("overlap", 1.0), ("unit_overhead_s", 1.0), ("compute_efficiency", 10.0))


@dataclass(frozen=True)
class Calibration:
    overlap: float | None
    unit_overhead_s: float | None
    compute_efficiency: float | None = None
    source: str = ""
    backend: str | None = None
    device: str | None = None
    compute_scale: float | None = None
    gpu: str | None = None
    measured: Any = None  # the compose record's kernels.ComputeCalibration (its step, its configuration)


def checked(cal: dict[str, Any], what: str = "--calibration") -> dict[str, float]:
    """The numbers of a summary.calibration that it holds, each finite and within BOUNDS."""
    return {
        key: parse_number(cal[key], what=f"{what} {key}", example="0.8", minimum=0, maximum=hi)
        for key, hi in BOUNDS
        if cal.get(key) is not None
    }


def from_record(record: dict[str, Any], path: str) -> Calibration:
    """`summary.calibration` of a `verify fsdp --calibrate-only` record: {overlap (0..1),
    unit_overhead_s, compute_efficiency, backend, device}."""
    summary = record.get("summary")
    cal = summary.get("calibration") if isinstance(summary, dict) else None
    if record.get("kind") == "compose":
        from .kernels.calibration import read_calibration

        measured = read_calibration(cal, path)
        return Calibration(None, None, source=path, compute_scale=measured.scale, gpu=measured.gpu, measured=measured)
    if record.get("kind") not in ("verify", "calibration") or not isinstance(cal, dict):
        raise UsageError(
            f"--calibration {path!r} is a {record.get('kind')!r} record without "
            f"summary.calibration; expected one from `microbench verify --calibrate-only` or "
            f"`microbench compose ... --measured-step SECONDS`"
        )
    values = checked(cal)
    if values.get("compute_efficiency") == 0:
        raise UsageError(
            f"--calibration {path!r} has compute_efficiency 0; expected a positive share, "
            f"e.g. 0.8: re-run `microbench verify fsdp --calibrate-only`"
        )
    return Calibration(
        values.get("overlap"),
        values.get("unit_overhead_s"),
        values.get("compute_efficiency"),
        path,
        str(cal["backend"]) if cal.get("backend") else None,
        str(cal["device"]) if cal.get("device") else None,
    )
