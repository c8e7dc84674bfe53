"""Predicted FSDP (full-shard, reshard after forward) step time from measured curves.

Per step, each of the L transformer blocks is one FSDP unit of P/L parameters:
  forward   : AllGather(unit params)                        per micro-batch
  backward  : AllGather(unit params) + ReduceScatter(grads)  per micro-batch (gathers); the
              reduce-scatter once per step when gradient sync is deferred to the last micro-batch
Compute: 2 P T FLOPs forward, 4 P T backward, +2 P T recompute with activation checkpointing,
for T tokens per rank per micro-batch, at the stated FLOP rate.
Overlap: FSDP prefetches the next unit's gather during the current unit's compute, so a unit
costs max(compute, communication) and only the first gather and the last reduce-scatter are
exposed. The no-overlap (sum) and full-overlap (max of totals) bounds bracket the estimate.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ..errors import UsageError
from .curves import Curve

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class ModelSpec:
    name: str
    params: float          # total parameters
    layers: int            # transformer blocks = FSDP units


PRESETS = {
    "llama-1b": ModelSpec("llama-1b", 1.24e9, 16),
    "llama-8b": ModelSpec("llama-8b", 8.03e9, 32),
    "llama-70b": ModelSpec("llama-70b", 70.6e9, 80),
    "tiny-100m": ModelSpec("tiny-100m", 1.0e8, 12),
}


@dataclass(frozen=True)
class TrainSpec:
    ranks: int
    tokens_per_rank: int              # per micro-batch: micro-batch size x sequence length
    flops_per_rank: float             # achieved FLOP/s per rank (measured or stated)
    grad_accum: int = 1
    param_dtype: str = "bfloat16"     # what AllGather moves
    reduce_dtype: str = "float32"     # what ReduceScatter moves
    activation_checkpointing: bool = False
    sync_every_microbatch: bool = False


@dataclass(frozen=True)
class StepPrediction:
    compute_s: float
    allgather_fwd_s: float
    allgather_bwd_s: float
    reduce_scatter_s: float
    step_s: float
    no_overlap_s: float
    full_overlap_s: float
    exposed_comm_s: float
    notes: tuple[str, ...]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def predict_step(model: ModelSpec, train: TrainSpec, allgather: Curve, reduce_scatter: Curve) -> StepPrediction:
    if train.ranks < 1 or model.layers < 1 or train.flops_per_rank <= 0:
        raise UsageError("ranks, layers and the FLOP rate must be positive, e.g. --ranks 8 --tflops 400")
    unit_params = model.params / model.layers
    ag_bytes = unit_params * DTYPE_BYTES[train.param_dtype]
    rs_bytes = unit_params * DTYPE_BYTES[train.reduce_dtype]
    t_ag, note_ag = allgather.time_s(ag_bytes, train.ranks)
    t_rs, note_rs = reduce_scatter.time_s(rs_bytes, train.ranks)
    if train.ranks == 1:
        t_ag = t_rs = 0.0

    tokens = train.tokens_per_rank
    per_unit_fwd = 2 * unit_params * tokens / train.flops_per_rank
    per_unit_bwd = (4 + (2 if train.activation_checkpointing else 0)) * unit_params * tokens / train.flops_per_rank
    micro = train.grad_accum
    rs_rounds = micro if train.sync_every_microbatch else 1

    L = model.layers
    compute = micro * L * (per_unit_fwd + per_unit_bwd)
    ag_fwd = micro * L * t_ag
    ag_bwd = micro * L * t_ag
    rs = rs_rounds * L * t_rs

    # Each pass exposes its first gather; every later unit costs max(its compute, the
    # communication it hides). In backward the next unit's gather and the previous unit's
    # reduce-scatter share the links, so they add; the last reduce-scatter is exposed.
    fwd = t_ag + (L - 1) * max(per_unit_fwd, t_ag) + per_unit_fwd
    bwd_plain = t_ag + (L - 1) * max(per_unit_bwd, t_ag) + per_unit_bwd
    bwd_sync = t_ag + (L - 1) * max(per_unit_bwd, t_ag + t_rs) + per_unit_bwd + t_rs
    if train.sync_every_microbatch:
        step = micro * (fwd + bwd_sync)
    else:
        step = micro * fwd + (micro - 1) * bwd_plain + bwd_sync
    comm = ag_fwd + ag_bwd + rs
    notes = tuple(sorted({f"allgather {note_ag}", f"reduce_scatter {note_rs}"}))
    return StepPrediction(compute, ag_fwd, ag_bwd, rs, step, compute + comm, max(compute, comm),
                          max(0.0, step - compute), notes)
