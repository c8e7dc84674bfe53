"""One what-if: the step prediction per network, the memory check, the checkpoint per tier, and
the compose record that holds them (pure: the command prints it and writes the record)."""

from __future__ import annotations

import platform
from dataclasses import dataclass, field
from typing import Any

from .checkpoint import full as full_save
from .. import __version__
from .checkpoint.tier import checkpoint_parts, predict_tier, required_write_gbps
from ..core.units import DTYPE_BYTES
from .fsdp import MemoryCheck, StepPrediction, memory_check, predict_step
from .inputs import ComposeInputs
from ..results import new_record


@dataclass
class Composition:
    inputs: ComposeInputs
    steps: dict[str, StepPrediction]     # network name -> its step
    memory: MemoryCheck
    parts: dict[str, float]              # checkpoint_parts: the bytes of each part of a checkpoint
    tiers: list[Any]                     # predict_tier per tier, in the inputs' order
    extra_rows: list[dict[str, Any]] = field(default_factory=list)   # more rows for the record (sharding)

    @property
    def checkpoint_bytes(self) -> float:
        return self.parts["training_checkpoint_bytes"]


def compose(inputs: ComposeInputs) -> Composition:
    model, train, rate = inputs.model, inputs.train, inputs.rate
    steps = {net.name: predict_step(model, train, net.all_gather, net.reduce_scatter) for net in inputs.networks}
    memory = memory_check(model, train, rate.gpu.usable_memory_bytes if rate.gpu else None)
    parts = checkpoint_parts(model.total_params, DTYPE_BYTES[train.param_dtype])
    staging = rate.gpu.host_link_gbps * inputs.world if rate.gpu else None
    tiers = [predict_tier(t["tier"], parts["training_checkpoint_bytes"], t["write_gbps"], t["read_gbps"],
                          staging_gbps=staging, mtbf_s=inputs.mtbf_s) for t in inputs.tiers]
    return Composition(inputs, steps, memory, parts, tiers)


def record(result: Composition, loading: dict[str, Any] | None = None) -> dict[str, Any]:
    """The compose record (kind "compose"), ready for a RecordWriter; loading: the data stall and
    model load summary (compose/dataload.loading_report), when asked for."""
    inputs, memory, parts = result.inputs, result.memory, result.parts
    model, train, rate, nets = inputs.model, inputs.train, inputs.rate, inputs.networks
    config = {"calibration": inputs.calibration.source if inputs.calibration else None, "model": model.describe(),
              "train": {**train.__dict__, "tokens_per_rank": train.tokens_per_rank},
              "compute": {"flops_per_rank": rate.flops_per_rank, "source": rate.source,
                          "gpu": rate.gpu.as_dict() if rate.gpu else None},
              "networks": [n.describe() for n in nets], "tiers": inputs.tiers,
              "checkpoint": {"interval_s": inputs.interval_s, "overhead_fraction": inputs.overhead,
                             "mtbf_s": inputs.mtbf_s}}
    # A prediction does not depend on the machine that computed it: no probe of the hardware here.
    environment = {"hostname": platform.node(), "python": platform.python_version(), "microbench": __version__}
    out = new_record("compose", config, environment, {"name": "python", "engine": "microbench.compose"})
    step_rows = [{"op": "step", "network": n.name, **result.steps[n.name].as_dict(), "fits_in_memory": memory.fits}
                 for n in nets]
    for row in step_rows:
        row["notes"] = list(row["notes"])
    ckpt_rows = [{"op": "save" if isinstance(t, full_save.SavePrediction) else "checkpoint", **t.as_dict(),
                  "checkpoint_bytes": parts["training_checkpoint_bytes"]} for t in result.tiers]
    out["rows"] = step_rows + ckpt_rows + list(result.extra_rows)
    out["summary"] = {"memory": memory.as_dict(), "fits_in_memory": memory.fits, "checkpoint": parts,
                      "required_write_gbps_blocking": required_write_gbps(
                          parts["training_checkpoint_bytes"], inputs.interval_s, inputs.overhead),
                      "warnings": [w for n in nets for w in n.warnings], **(loading or {})}
    return out
