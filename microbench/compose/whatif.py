"""One composition, everything `microbench compose` predicts from its inputs: the step per
network, the memory check, the checkpoint per tier and the saves as trainers write them, the
sharding what-if, the data stall and model load, the whole job; and the compose record that
holds them. Pure: the command prints it and writes the record; every refusal comes from here,
before anything is printed."""

from __future__ import annotations

import platform
from dataclasses import dataclass, field, replace
from typing import Any

from .. import __version__
from ..core.errors import UsageError
from ..core.sections import resolved
from ..core.units import DTYPE_BYTES
from ..results import new_record
from . import dataload, kernels
from .checkpoint import full as full_save
from .checkpoint.tier import checkpoint_parts, predict_tier, required_write_gbps
from .fsdp import MemoryCheck, StepPrediction, memory_check, predict_step
from .inputs import ComposeInputs
from .job import report as job_report
from .sharding import whatif as sharding_whatif


@dataclass
class Composition:
    inputs: ComposeInputs
    steps: dict[str, StepPrediction]     # network name -> its step
    memory: MemoryCheck
    parts: dict[str, float]              # checkpoint_parts: the bytes of each part of a checkpoint
    tiers: list[Any]                     # predict_tier per tier, in the inputs' order
    saves: list[full_save.SavePrediction] = field(default_factory=list)   # per tier and state dict
    sharding: list[sharding_whatif.ShardingRow] = field(default_factory=list)   # at the job's node count
    scaled: list[sharding_whatif.ShardingRow] = field(default_factory=list)     # at --scale-nodes
    loading: dataload.Loading = field(default_factory=lambda: dataload.Loading([], []))
    job: job_report.JobResult | None = None
    measured: kernels.ComputeCalibration | None = None   # --measured-step: the scale found on this configuration

    @property
    def checkpoint_bytes(self) -> float:
        return self.parts["training_checkpoint_bytes"]

    @property
    def full_saves(self) -> bool:
        """A full state dict was asked for: the saves table beside the sharded one above it."""
        return "full" in self.inputs.state_dicts


def measured_step(inputs: ComposeInputs) -> tuple[ComposeInputs, kernels.ComputeCalibration | None]:
    """--measured-step: the scale on every compute rate with which this configuration's step is
    the one measured (kernels/calibration.py), applied to everything predicted after it."""
    c, model, train = inputs.options.compute, inputs.model, inputs.train
    if c.measured_step is None:
        return inputs, None
    if inputs.rates is None:
        raise UsageError(f"--measured-step {c.measured_step:g} scales compute priced per kernel: it needs a model "
                         f"with shapes (--model or --model-config, not --params/--layers) and --gpu, without a CPU's "
                         f"--compute record")
    if len(inputs.networks) != 1:
        raise UsageError(f"--measured-step {c.measured_step:g} was measured on one network; "
                         f"{len(inputs.networks)} are given ({', '.join(n.name for n in inputs.networks)}): give the "
                         f"one it ran on")
    net, gpu = inputs.networks[0], inputs.rate.gpu
    assert gpu is not None   # --measured-step without --gpu is refused (ComposeOptions.check)
    t = inputs.options.training
    config = {"model": model.name, "gpu": gpu.name, "ranks": inputs.world, "nodes": inputs.nodes,
              "micro_batch": t.micro_batch, "seq_len": t.seq_len, "grad_accum": t.grad_accum,
              "activation_checkpointing": t.activation_checkpointing, "network": net.name}

    cal = kernels.calibrate_step(c.measured_step, gpu.name, config, model, train, net)
    return replace(inputs, train=replace(train, compute_scale=cal.scale)), cal


def compose(inputs: ComposeInputs) -> Composition:
    inputs, measured = measured_step(inputs)
    model, train, rate = inputs.model, inputs.train, inputs.rate
    steps = {net.name: predict_step(model, train, net.all_gather, net.reduce_scatter) for net in inputs.networks}
    memory = memory_check(model, train, rate.gpu.usable_memory_bytes if rate.gpu else None)
    parts = checkpoint_parts(model.total_params, DTYPE_BYTES[train.param_dtype])
    staging = rate.gpu.host_link_gbps * inputs.world if rate.gpu else None
    tiers = [predict_tier(t.name, parts["training_checkpoint_bytes"], t.write_gbps, t.read_gbps,
                          staging_gbps=staging, mtbf_s=inputs.mtbf_s) for t in inputs.tiers]
    out = Composition(inputs, steps, memory, parts, tiers, measured=measured)
    step_s = {n.name: steps[n.name].step_s for n in inputs.networks}
    out.job = job_report.run(inputs, out.checkpoint_bytes, step_s)
    if inputs.sharding is not None:
        capacity = rate.gpu.usable_memory_bytes if rate.gpu else None
        out.sharding = sharding_whatif.whatif(model, train, inputs.networks, inputs.sharding, capacity)
        out.scaled = sharding_whatif.scale(model, train, inputs.networks, inputs.sharding, capacity)
    if inputs.tiers:
        out.saves = full_save.predict_saves(
            inputs.tiers, inputs.state_dicts, inputs.options.storage.save_format, out.checkpoint_bytes,
            unit_bytes=4.0 * model.block_params, ranks=inputs.world, nodes=inputs.nodes or 1,
            curve=inputs.networks[0].all_gather, serialize_gbps=inputs.serialize_gbps,
            host_link_gbps=rate.gpu.host_link_gbps if rate.gpu else None, host_memory_bytes=inputs.host_memory_bytes)
    loading = inputs.options.loading
    rates = dataload.data_rates([(r.name, r.path) for r in loading.dataload], loading.data_rate,
                                loading.sample_bytes.value if loading.sample_bytes else None, inputs.load)
    out.loading = dataload.loading(rates, [(r.name, r.path) for r in loading.modelload], inputs.tiers,
                                   model.total_params * DTYPE_BYTES[train.param_dtype],
                                   train.micro_batch * train.grad_accum, step_s, inputs.mtbf_s, inputs.load)
    return out


def record(result: Composition) -> dict[str, Any]:
    """The compose record (kind "compose"), ready for a RecordWriter."""
    inputs, memory, parts = result.inputs, result.memory, result.parts
    model, train, rate, nets = inputs.model, inputs.train, inputs.rate, inputs.networks
    config = {"calibration": inputs.calibration.source if inputs.calibration else None, "model": model.describe(),
              # the priced kernels are summary.compute's breakdown, not a field of the configuration
              "train": {**{k: v for k, v in train.__dict__.items() if k != "kernel_compute"},
                        "tokens_per_rank": train.tokens_per_rank},
              "compute": {"flops_per_rank": rate.flops_per_rank, "source": rate.source,
                          "gpu": rate.gpu.as_dict() if rate.gpu else None,
                          "priced_per_kernel": train.kernel_compute is not None},
              "networks": [n.describe() for n in nets], "tiers": [t.as_dict() for t in inputs.tiers],
              "checkpoint": {"interval_s": inputs.interval_s, "overhead_fraction": inputs.overhead,
                             "mtbf_s": inputs.mtbf_s},
              "options": resolved(inputs.options)}
    # A prediction does not depend on the machine that computed it: no probe of the hardware here.
    environment = {"hostname": platform.node(), "python": platform.python_version(), "microbench": __version__}
    out = new_record("compose", config, environment, {"name": "python", "engine": "microbench.compose"})
    step_rows = [{"op": "step", "network": n.name, **result.steps[n.name].as_dict(), "fits_in_memory": memory.fits}
                 for n in nets]
    for row in step_rows:
        row["notes"] = list(row["notes"])
    tiers = result.tiers + (result.saves if result.full_saves else [])
    ckpt_rows = [{"op": "save" if isinstance(t, full_save.SavePrediction) else "checkpoint", **t.as_dict(),
                  "checkpoint_bytes": parts["training_checkpoint_bytes"]} for t in tiers]
    sharding_rows = ([r.as_dict() for r in result.sharding]
                     + [dict(r.as_dict(), scaled=True, method=sharding_whatif.SCALE_METHOD) for r in result.scaled])
    out["rows"] = step_rows + ckpt_rows + sharding_rows + (result.job.rows() if result.job else [])
    out["summary"] = {"memory": memory.as_dict(), "fits_in_memory": memory.fits, "checkpoint": parts,
                      "required_write_gbps_blocking": required_write_gbps(
                          parts["training_checkpoint_bytes"], inputs.interval_s, inputs.overhead),
                      "warnings": [w for n in nets for w in n.warnings], **result.loading.as_dict()}
    if result.job is not None:
        out["summary"]["job"] = result.job.summary()
    priced = train.kernel_compute
    if priced is not None:
        out["summary"]["compute"] = {
            "breakdown": [
                {**r.as_dict(), "time_s": r.time_s / train.compute_scale, "rate": r.rate * train.compute_scale}
                for r in priced.rows
            ],
            "priced_per_kernel": True,
            "compute_scale": train.compute_scale,
            "checkpointing": priced.checkpointing,
            "gradient_sync": "every micro-batch" if train.sync_every_microbatch else "last micro-batch",
            "memory_bytes_from": list(priced.memory_from),
            "flops_per_step": priced.flops_per_step,
            "scale_from": (
                "--measured-step"
                if result.measured
                else inputs.calibration.source
                if inputs.calibration and inputs.calibration.compute_scale
                else None
            ),
        }
    if result.measured is not None:
        out["summary"]["calibration"] = result.measured.as_dict()
    return out
