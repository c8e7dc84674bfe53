"""Verification, rank side: for one configuration (model shape x tokens on this world), measure
the composer's inputs with the probes, predict with the composer, then time real FSDP2 steps.

Inputs, all measured in this invocation and none from the steps being predicted:
  compute      `microbench compute`'s kernels at the step's shapes (matmuls forward and backward,
               attention), replayed in step order right before each measured step, every rank
               at once from a barrier (ranks share the cores as in training); the median;
  collectives  the collective probe's AllGather and ReduceScatter at the block's and the root's
               unit sizes, in the dtypes FSDP moves; one reading right before each measured step;
  optimizer    AdamW over one flat tensor of this rank's shard size, as bytes moved per second
               (the composer's memory bandwidth term); one step right before each measured step
               (paired.py reads the three together; a step is predicted from its own);
  calibration  overlap, FSDP's per-unit cost and the compute efficiency of the non-matmul work,
               from calibrate.py on a configuration of its own (or a --calibration record).
Measured (measure.py): forward, backward, optimizer step and zero_grad of the fully_shard model, every rank
starting together; the slowest rank's time per step. Beside it, per part, so a miss can be
explained: the unsharded model's forward+backward alone (compute), the step's collectives alone
in sequence (communication), and the overlap those two imply.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from ...compose.calibration import Calibration
from ...compose.curves import Curve
from ...compose.fsdp import ADAMW_BYTES_MOVED_PER_PARAM, TrainSpec, compute_times, predict_step, unit_bytes
from ...compose.model import ModelShape
from ...core.stats import percentile
from ...probes import compute as cm, nccl as coll
from ...probes.compute.config import shape_fields
from ...probes.compute.replay import StepReplay
from ...run.runner import SweepSettings, measure_case
from ...world.dist import World
from .. import model as fm
from . import hybrid


def sync(device: Any) -> None:
    import torch

    if getattr(device, "type", device) == "cuda":
        torch.cuda.synchronize()


def slowest(world: World, value: float) -> float:
    return max(world.all_gather_object(value))


def _settings(budget_s: float = 0.4, iters: int = 6) -> SweepSettings:
    return SweepSettings(warmup=2, iters=iters, budget_s_per_case=budget_s, min_iters=3, check=False, progress=False)


# --------------------------------------------------------------------------- probes (inputs)


def step_flops(shape: ModelShape, tokens: int) -> float:
    """The composer's FLOPs for one rank's forward+backward (what its compute term divides by the rate)."""
    c = compute_times(shape, TrainSpec(ranks=1, micro_batch=1, seq_len=tokens, flops_per_rank=1.0))
    return shape.layers * (c["block_fwd"] + c["block_bwd"]) + c["root_fwd"] + c["root_bwd"]


def replay(shape: ModelShape, tokens: int, device: str, dtype: str) -> StepReplay:
    """`microbench compute`'s kernels at this model's shapes, forward and backward, in step order."""
    config = cm.Config(
        **shape_fields(shape),
        tokens=tokens,
        device=device,
        dtype=dtype,
        backward=True,
    )
    return StepReplay(config, shape.heads, shape.kv_heads)


def compute_input(shape: ModelShape, tokens: int, samples_s: list[float]) -> dict[str, Any]:
    """The compute rate the composer gets: its own FLOPs for the step over the replay's median
    time, so its compute term is the replay's time (the calibration scales it for the rest)."""
    median = percentile(samples_s, 50)
    rate = step_flops(shape, tokens) / median
    return {
        "flops_per_rank": rate,
        "tflops": rate / 1e12,
        "replay_s": median,
        "samples_s": list(samples_s),
        "spread_pct": spread_pct(samples_s),
        "probe": "compute: matmuls and attention at the step's shapes, forward and backward, every rank at once",
    }


def unit_sizes(shape: ModelShape, precision: fm.Precision) -> dict[str, int]:
    """Bytes of one unsharded unit as the collectives move it (nccl-tests size convention)."""

    def size(unit: str, op: str) -> int:
        return unit_bytes(shape, unit, op, precision.param_dtype, precision.reduce_dtype)

    return {
        "block_ag": size("block", "all_gather"),
        "root_ag": size("root", "all_gather"),
        "block_rs": size("block", "reduce_scatter"),
        "root_rs": size("root", "reduce_scatter"),
    }


# One reading of the collective probe taken right before a step: every case once more, few
# iterations (a step's prediction needs this moment's level, the median of pairs the rest).
PAIRED = SweepSettings(warmup=1, iters=3, budget_s_per_case=0.2, min_iters=3, check=False, progress=False)
KEEP = ("op", "size_bytes", "dtype", "ranks", "busbw_gbps", "time_us")


def collectives_sampler(
    world: World, shape: ModelShape, precision: fm.Precision, device: str, backend: str, layout: Any = None
) -> Callable[[SweepSettings], dict[str, Any]]:
    """The collective probe at the unit sizes (hybrid: within each node, and the all-reduce across
    nodes), built once: its groups and buffers. Each call measures every case again with the
    settings given and returns the collectives input predict() takes."""
    sizes = unit_sizes(shape, precision)
    keep: tuple[str, ...]
    if layout is not None and layout.hybrid:
        cases, extra = hybrid.collective_cases(world, precision, device, backend, sizes)
        keep = hybrid.KEEP
        extra = {**extra, "backend": backend, "device": device}
    else:
        cases, keep = [], KEEP
        for op, dtype, keys in (
            ("all_gather", precision.param_dtype, ("block_ag", "root_ag")),
            ("reduce_scatter", precision.reduce_dtype, ("block_rs", "root_rs")),
        ):
            config = coll.Config(
                sizes=sorted({sizes[k] for k in keys}), ops=[op], dtype=dtype, backend=backend, device=device
            )
            probe = coll.CollectiveProbe(config, world)
            cases += [(probe, case) for case in probe.cases() if case.param("placement") == "out"]
        extra = {"probe": "collectives at the unit sizes (out of place)"}

    def once(settings: SweepSettings) -> dict[str, Any]:
        rows = [measure_case(probe, case, settings, world) for probe, case in cases]
        return {**extra, "rows": [{k: r[k] for k in keep} for r in rows]}

    return once


def probe_collectives(
    world: World, shape: ModelShape, precision: fm.Precision, device: str, backend: str, layout: Any = None
) -> dict[str, Any]:
    return collectives_sampler(world, shape, precision, device, backend, layout)(_settings(budget_s=0.6))


def curves(collectives: dict[str, Any], ranks: int) -> tuple[Curve, Curve]:
    record = {"rows": collectives["rows"], "config": {"world": {"size": ranks}}}
    return (
        Curve.from_record(record, "all_gather", "measured in this run"),
        Curve.from_record(record, "reduce_scatter", "measured in this run"),
    )


def optimizer_sampler(
    world: World, shape: ModelShape, device: Any, layout: Any = None
) -> tuple[Callable[[], float], int]:
    """One AdamW step per call over one flat fp32 tensor the size of this rank's shard, every
    rank at once: the slowest rank's seconds. Returns (sampler, shard params), the sampler warm:
    two untimed steps first allocate AdamW's state and warm the caches."""
    import torch

    shards = layout.topo.ranks_per_node if layout is not None and layout.hybrid else world.size
    n = max(1, shape.total_params // shards)
    param = torch.nn.Parameter(torch.zeros(n, device=device))
    param.grad = torch.full_like(param, 1e-3)
    optim = torch.optim.AdamW([param], lr=1e-4)

    def once() -> float:
        world.barrier()
        start = time.perf_counter()
        optim.step()
        sync(device)
        return slowest(world, time.perf_counter() - start)

    once(), once()
    return once, n


def optimizer_input(time_s: float, shard_params: int) -> dict[str, Any]:
    """AdamW's time over the shard as the composer takes it: bytes moved per second."""
    return {
        "memory_gbps": shard_params * ADAMW_BYTES_MOVED_PER_PARAM / time_s / 1e9,
        "shard_params": shard_params,
        "time_s": time_s,
        "probe": "AdamW over a flat tensor of the shard's size",
    }


def probe_optimizer(world: World, shape: ModelShape, device: Any, layout: Any = None) -> dict[str, Any]:
    """AdamW over one flat fp32 tensor the size of this rank's shard: bytes moved per second."""
    once, n = optimizer_sampler(world, shape, device, layout)
    return optimizer_input(percentile([once() for _ in range(4)], 50), n)


# --------------------------------------------------------------------------- prediction


def train_spec(
    shape: ModelShape,
    tokens: int,
    ranks: int,
    precision: fm.Precision,
    compute: dict[str, Any],
    optimizer: dict[str, Any],
    cal: Calibration,
) -> TrainSpec:
    assert cal.overlap is not None and cal.unit_overhead_s is not None  # verify calibrates both first
    return TrainSpec(
        ranks=ranks,
        micro_batch=1,
        seq_len=tokens,
        flops_per_rank=compute["flops_per_rank"] * cal.compute_efficiency,
        param_dtype=precision.param_dtype,
        reduce_dtype=precision.reduce_dtype,
        overlap=cal.overlap,
        unit_overhead_s=cal.unit_overhead_s,
        memory_gbps=optimizer["memory_gbps"],
    )


def predict(
    shape: ModelShape,
    tokens: int,
    ranks: int,
    precision: fm.Precision,
    compute: dict[str, Any],
    collectives: dict[str, Any],
    optimizer: dict[str, Any],
    cal: Calibration,
) -> dict[str, Any]:
    train = train_spec(shape, tokens, ranks, precision, compute, optimizer, cal)
    if "topology" in collectives:  # hybrid: the composer's HSDP step over the two levels measured
        return hybrid.predict(shape, train, collectives, collectives["backend"], collectives["device"])
    ag, rs = curves(collectives, ranks)
    out = predict_step(shape, train, ag, rs).as_dict()
    out["notes"] = list(out["notes"])
    return out


# --------------------------------------------------------------------------- predicted vs measured


def parts(
    pred: dict[str, Any], pipelined_s: float, measured_s: float, compute_alone_s: float, comm_alone_s: float
) -> dict[str, Any]:
    """Predicted vs measured per part, and the overlap the step implies on the composer's scale:
    the time it hid, (compute alone + collectives alone + optimizer + overhead - step), over the
    most the composer's pipelined step can hide (its serial bound minus its pipelined step)."""
    comm_pred = (
        pred["allgather_fwd_s"] + pred["allgather_bwd_s"] + pred["reduce_scatter_s"] + pred.get("allreduce_s", 0.0)
    )
    rest = pred["optimizer_s"] + pred["fsdp_overhead_s"]
    hideable = pred["no_overlap_s"] - pipelined_s
    hidden = compute_alone_s + comm_alone_s + rest - measured_s
    return {
        "compute": {
            "predicted_s": pred["compute_s"],
            "measured_alone_s": compute_alone_s,
            "error_pct": error_pct(pred["compute_s"], compute_alone_s),
        },
        "collectives": {
            "predicted_s": comm_pred,
            "measured_alone_s": comm_alone_s,
            "error_pct": error_pct(comm_pred, comm_alone_s) if comm_alone_s > 0 else None,
        },
        "overlap": {
            "used": None,
            "implied_by_step": hidden / hideable if hideable > 0 else None,
            "hidden_s": hidden,
            "hideable_s": hideable,
        },
        "rest": {"optimizer_s": pred["optimizer_s"], "fsdp_overhead_s": pred["fsdp_overhead_s"]},
    }


def error_pct(predicted: float, measured: float) -> float:
    return 100.0 * (predicted - measured) / measured


def paired_error_pct(predicted_each: list[float], measured_each: list[float]) -> float:
    """The median of the pairs' errors: each measurement against the prediction made from the
    probe sample taken right before it. A shared machine's speed drifts by tens of percent within
    a run; a pair shares the drift, two medians taken apart do not (docs/verify.md)."""
    return percentile([error_pct(p, m) for p, m in zip(predicted_each, measured_each, strict=False)], 50)


def spread_pct(times: list[float]) -> float:
    """(max - min) / median of the repeated measurements, in percent."""
    med = percentile(times, 50)
    return 100.0 * (max(times) - min(times)) / med if med > 0 else 0.0
