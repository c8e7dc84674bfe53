"""Predicted FSDP2 step time and per-GPU memory from a model's shapes, a FLOP rate and
collective curves.

Units as FSDP2 builds them: one per transformer block, plus the root (embeddings, final norm,
head, towers). Per micro-batch on every rank:
  root      : AllGather once before forward; its parameters stay gathered until backward ends
              (nothing to prefetch it behind), then one ReduceScatter of its gradients.
  blocks    : AllGather before forward; resharded after forward and gathered again in backward
              (unless reshard_after_forward is off); ReduceScatter of gradients in backward.
AllGather moves param_dtype, ReduceScatter reduce_dtype; a mixture of experts without expert
parallelism moves every expert but computes with the top-k. Sizes follow nccl-tests: the
unsharded unit's bytes.

Compute per micro-batch (T tokens per rank, s the sequence length, H = heads x head_dim):
  forward  = 2 x active params x T + causal attention 2 x T x s x H per layer (QK^T and AV,
             half the square; less on sliding-window layers); backward = 2 x forward; activation checkpointing re-runs
             the blocks' forward. The head's matmul is in the active params; towers do not
             compute on text-only batches.
Overlap: FSDP2 prefetches the next unit's gather behind the current unit's compute, so a unit
costs max(compute, communication); the first gather of each pass and the last reduce-scatters
are exposed. In backward a gather and a reduce-scatter share the links, so they add. `overlap`
(0..1) blends this with the no-overlap bound: gloo on a CPU competes with compute for the same
cores, NCCL on a GPU runs beside it, but on SMs of its own: while a collective runs, the unit's
compute keeps (1 - contention) of its rate (`beside`; the GPU's kernel table says how much).
FSDP's own per-unit cost (copy-in/out, hooks: `unit_overhead_s`, which `verify`'s calibration
measures) is paid per unit per pass on the thread that launches compute, so it is never hidden.
The optimizer step (AdamW over this rank's shard) follows backward, bound by memory bandwidth:
~28 bytes moved per parameter for a fused AdamW
(`optimizer_bytes_per_param` for another implementation, gradient clipping included).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from ..core.errors import UsageError
from ..core.units import DTYPE_BYTES, bus_factor

ADAMW_BYTES_MOVED_PER_PARAM = 28   # read param, grad, m, v (16) + write param, m, v (12), fp32
SHARDED_STATE_BYTES_PER_PARAM = 16  # fp32 master + fp32 grad + AdamW m and v
UNITS = ("root", "block")


@dataclass(frozen=True)
class Collective:
    """One collective of FSDP2's step: which op, on which unit, in which pass."""
    op: str           # all_gather | reduce_scatter | all_reduce (HSDP: across the replicas)
    unit: str         # root | block
    phase: str        # forward | backward


def schedule(layers: int, *, reshard_after_forward: bool = True, replicas: bool = False) -> list[Collective]:
    """The collectives of one micro-batch in the order FSDP2 issues them, the one list that
    predict_step prices and verify runs back to back to time communication alone. Forward: the
    root's AllGather, then each block's. Backward: each block gathered again (unless kept since
    forward) and its gradients reduce-scattered, the root's ReduceScatter last. With replicas
    (HSDP), each unit's gradient shard is all-reduced across them right after its ReduceScatter."""
    out = [Collective("all_gather", "root", "forward")] + [Collective("all_gather", "block", "forward")] * layers
    block = ([Collective("all_gather", "block", "backward")] if reshard_after_forward else []) + \
        [Collective("reduce_scatter", "block", "backward")] + \
        ([Collective("all_reduce", "block", "backward")] if replicas else [])
    out += block * layers + [Collective("reduce_scatter", "root", "backward")]
    return out + ([Collective("all_reduce", "root", "backward")] if replicas else [])


def unit_bytes(model: Any, unit: str, op: str, param_dtype: str, reduce_dtype: str) -> Any:
    """Bytes of one unsharded unit as a collective moves it (nccl-tests' size): AllGather moves
    parameters in param_dtype, ReduceScatter and the replicas' all-reduce gradients in
    reduce_dtype (the all-reduce over a shard of it: these bytes over the shard group's ranks)."""
    params = model.root_params if unit == "root" else model.block_params
    return params * DTYPE_BYTES[param_dtype if op == "all_gather" else reduce_dtype]


class CollectiveCurve(Protocol):
    @property
    def latency_s(self) -> float: ...

    def time_s(self, size_bytes: float, ranks: int | None = None) -> tuple[float, str]: ...


@dataclass(frozen=True)
class TrainSpec:
    ranks: int
    micro_batch: int
    seq_len: int
    flops_per_rank: float              # achieved FLOP/s per rank
    grad_accum: int = 1
    param_dtype: str = "bfloat16"      # what AllGather moves
    reduce_dtype: str = "bfloat16"     # what ReduceScatter moves
    activation_checkpointing: bool | str = False   # True/"full", "none", "blocks:F", "ops" (kernels/recompute.py)
    reshard_after_forward: bool = True
    sync_every_microbatch: bool = True  # FSDP2's default; False: only the last micro-batch reduces
    overlap: float = 1.0
    unit_overhead_s: float = 0.0        # FSDP's own cost per unit per pass (copy-in/out, hooks)
    memory_gbps: float | None = None    # device memory bandwidth, for the optimizer step
    optimizer_bytes_per_param: float = ADAMW_BYTES_MOVED_PER_PARAM   # the optimizer step's (and clipping's) traffic
    # The share of its rate compute loses while a collective runs beside it: NCCL's CTAs hold whole
    # SMs, and kernels sized for every SM wait for them (kernels/tables.py `overlap`).
    contention: float = 0.0
    # Compute priced per kernel (compose/kernels): the per-micro-batch unit times that replace
    # FLOPs / flops_per_rank, and the calibration's scale on every compute rate.
    kernel_compute: Any = None
    compute_scale: float = 1.0
    loss_kernel: str = "eager"          # "fused": one cross-entropy kernel over bf16 logits (kernels/blocks.py)
    # What the eager count (kernels/eager.py) prices memory-bound work as: "bf16" parameters without
    # autocast or "amp_bf16" with it; the code around the attention kernel ("sdpa", or llm-foundry's
    # "llmfoundry-triton" / "llmfoundry-flash"); a recompute that stops once backward has what it
    # needs (torch >= 2.1) or re-runs the whole forward (torch <= 2.0); counted_ops False prices
    # blocks.py's hand-listed memory-bound kernels instead (the comparison the benchmark prints).
    precision: str = "bf16"
    attention_call: str = "sdpa"
    recompute_early_stop: bool = True
    counted_ops: bool = True

    @property
    def tokens_per_rank(self) -> int:
        return self.micro_batch * self.seq_len


@dataclass(frozen=True)
class StepPrediction:
    compute_fwd_s: float
    compute_bwd_s: float
    allgather_fwd_s: float
    allgather_bwd_s: float
    reduce_scatter_s: float
    optimizer_s: float
    fsdp_overhead_s: float
    step_s: float
    no_overlap_s: float
    full_overlap_s: float
    exposed_comm_s: float
    tokens_per_s: float
    breakeven_busbw_gbps: float        # above it the step is compute-bound (inf: never)
    notes: tuple[str, ...]

    @property
    def compute_s(self) -> float:
        return self.compute_fwd_s + self.compute_bwd_s

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "compute_s": self.compute_s}


def _check(model: Any, train: TrainSpec) -> None:
    if train.ranks < 1 or model.layers < 1 or not (train.flops_per_rank > 0 and math.isfinite(train.flops_per_rank)):
        raise UsageError("ranks, layers and the FLOP rate must be positive, e.g. --ranks 8 --tflops 400")
    for what, dtype in (("--param-dtype", train.param_dtype), ("--reduce-dtype", train.reduce_dtype)):
        if dtype not in DTYPE_BYTES:
            raise UsageError(f"invalid {what} {dtype!r}: expected one of {', '.join(DTYPE_BYTES)} (e.g. bfloat16)")
    if not 0 <= train.overlap <= 1:
        raise UsageError(f"invalid --overlap {train.overlap!r}: expected a fraction from 0 to 1, e.g. 1")
    if not 0 <= train.contention < 1:
        raise UsageError(f"the compute lost beside collectives {train.contention!r} must be from 0 to under 1")
    if not (0 <= train.unit_overhead_s < 1):
        raise UsageError(
            f"invalid --unit-overhead {train.unit_overhead_s!r} s: expected 0 or more, under 1 s, e.g. 200us"
        )


def checkpointing(train: TrainSpec) -> Any:
    from .kernels.recompute import parse_checkpointing

    return parse_checkpointing(train.activation_checkpointing)


def attention_flops_fwd_per_layer(model: Any, train: TrainSpec) -> float:
    """QK^T and AV, 2 FLOPs per multiply-add each, over the keys a query sees on average: s/2
    under a causal mask, and w (1 - w / 2s) on a sliding-window layer of width w < s. Averaged
    over the layers, since every block is one FSDP unit of the same size."""
    heads, head_dim = getattr(model, "heads", 0), getattr(model, "head_dim", 0)
    s = train.seq_len
    keys = s / 2
    window, sliding = getattr(model, "sliding_window", 0), getattr(model, "sliding_layers", 0)
    if window and window < s and sliding:
        local = window * (1 - window / (2 * s))
        keys = (sliding * local + (model.layers - sliding) * s / 2) / model.layers
    return 4.0 * train.tokens_per_rank * keys * heads * head_dim


def compute_times(model: Any, train: TrainSpec) -> dict[str, float]:
    """Per micro-batch: one block's forward and backward (recompute included), the root's."""
    if train.kernel_compute is not None:
        return train.kernel_compute.times(train.compute_scale)
    tokens = train.tokens_per_rank
    block_fwd = (2.0 * model.block_active_params * tokens + attention_flops_fwd_per_layer(model, train))
    block_bwd = 2 * block_fwd + block_fwd * checkpointing(train).fraction
    root_fwd = 2.0 * (model.active_params - model.layers * model.block_active_params) * tokens
    rate = train.flops_per_rank
    return {"block_fwd": block_fwd / rate, "block_bwd": block_bwd / rate,
            "root_fwd": root_fwd / rate, "root_bwd": 2 * root_fwd / rate}


def optimizer_s(model: Any, train: TrainSpec) -> float:
    if not train.memory_gbps:
        return 0.0
    return model.total_params / train.ranks * train.optimizer_bytes_per_param / (train.memory_gbps * 1e9)


def beside(compute_s: float, comm_s: float, contention: float) -> float:
    """A unit's compute and the collective prefetched behind it, run together: while the
    collective runs, compute progresses at (1 - contention) of its rate, so it loses contention x
    comm_s of progress (all of it, when the collective outlasts the compute); the unit ends with
    the later of the two."""
    return max(comm_s, compute_s + contention * min(comm_s, compute_s / (1 - contention)))


def predict_step(model: Any, train: TrainSpec, allgather: CollectiveCurve,
                 reduce_scatter: CollectiveCurve) -> StepPrediction:
    _check(model, train)
    L, n = model.layers, train.ranks
    notes: set[str] = set()

    def coll(curve: CollectiveCurve, size: float, what: str) -> float:
        if n == 1 or size <= 0:
            return 0.0
        t, how = curve.time_s(size, n)
        notes.add(f"{what} {how}")
        return t

    def size(unit: str, op: str) -> float:
        return unit_bytes(model, unit, op, train.param_dtype, train.reduce_dtype)

    ag = coll(allgather, size("block", "all_gather"), "allgather")
    rs = coll(reduce_scatter, size("block", "reduce_scatter"), "reduce_scatter")
    ag_root = coll(allgather, size("root", "all_gather"), "allgather")
    rs_root = coll(reduce_scatter, size("root", "reduce_scatter"), "reduce_scatter")
    c = compute_times(model, train)
    cf, cb = c["block_fwd"], c["block_bwd"]
    opt = optimizer_s(model, train)
    micro = train.grad_accum
    rs_rounds = micro if train.sync_every_microbatch else 1
    ag_b = ag if train.reshard_after_forward else 0.0

    share = train.contention
    fwd = ag_root + ag + (L - 1) * beside(cf, ag, share) + cf + c["root_fwd"]

    def bwd(sync: bool) -> float:
        r, r_root = (rs, rs_root) if sync else (0.0, 0.0)
        # the head's backward runs while the last block is gathered again
        return beside(c["root_bwd"], ag_b, share) + (L - 1) * beside(cb, ag_b + r, share) + cb + r + r_root

    # FSDP's per-unit work runs on the CPU thread that launches compute: never hidden.
    overhead = micro * 2 * (L + (1 if model.root_params else 0)) * train.unit_overhead_s
    model_step = micro * fwd + (micro - rs_rounds) * bwd(False) + rs_rounds * bwd(True) + opt + overhead
    compute_fwd = micro * (L * cf + c["root_fwd"])
    compute_bwd = micro * (L * cb + c["root_bwd"])
    ag_fwd_total = micro * (ag_root + L * ag)
    ag_bwd_total = micro * L * ag_b
    rs_total = rs_rounds * (L * rs + rs_root)
    comm = ag_fwd_total + ag_bwd_total + rs_total
    compute = compute_fwd + compute_bwd
    no_overlap = compute + comm + opt + overhead
    full_overlap = max(compute, comm) + opt + overhead
    step = train.overlap * model_step + (1 - train.overlap) * no_overlap
    tokens = train.tokens_per_rank * micro * n
    return StepPrediction(compute_fwd, compute_bwd, ag_fwd_total, ag_bwd_total, rs_total, opt, overhead, step,
                          no_overlap, full_overlap, max(0.0, step - compute - opt - overhead), tokens / step,
                          breakeven_busbw_gbps(model, train, cf, cb, allgather.latency_s), tuple(sorted(notes)))


def breakeven_busbw_gbps(model: Any, train: TrainSpec, cf: float, cb: float, latency_s: float) -> float:
    """The bus bandwidth at which every block's communication fits behind its compute (with the
    network's latency): forward ag <= cf, backward ag + rs <= cb. inf when latency alone is too
    much; 0 for a single rank."""
    n = train.ranks
    if n == 1:
        return 0.0
    factor = bus_factor("all_gather", n)   # the same (n-1)/n as reduce_scatter
    ag_bytes = model.block_params * DTYPE_BYTES[train.param_dtype] * factor
    rs_bytes = model.block_params * DTYPE_BYTES[train.reduce_dtype] * factor
    needs = []
    for nbytes, budget in ((ag_bytes, cf - latency_s),
                           ((ag_bytes if train.reshard_after_forward else 0) + rs_bytes,
                            cb - (2 if train.reshard_after_forward else 1) * latency_s)):
        if budget <= 0:
            return math.inf
        needs.append(nbytes / budget / 1e9)
    return max(needs)


# --------------------------------------------------------------------------- memory per GPU

@dataclass(frozen=True)
class MemoryCheck:
    sharded_state_bytes: float         # fp32 params, grads, AdamW moments: this rank's shard
    gathered_bytes: float              # unsharded units in flight and their gradients
    activation_bytes: float | None     # with the chosen checkpointing setting
    activation_bytes_no_ac: float | None
    activation_bytes_ac: float | None
    total_bytes: float
    capacity_bytes: float | None       # usable device memory
    fits: bool | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def activation_bytes(model: Any, train: TrainSpec, mode: Any) -> float | None:
    """bf16 tensors backward needs, per micro-batch, under a checkpointing mode (True, False or
    a mode's text): kernels/recompute.activation_bytes says what each keeps."""
    from .kernels.recompute import activation_bytes as kept, parse_checkpointing

    return kept(model, train.micro_batch, train.seq_len, parse_checkpointing(mode))


def memory_check(model: Any, train: TrainSpec, capacity_bytes: float | None) -> MemoryCheck:
    pd, rd = DTYPE_BYTES[train.param_dtype], DTYPE_BYTES[train.reduce_dtype]
    sharded = SHARDED_STATE_BYTES_PER_PARAM * model.total_params / train.ranks
    unit_grads = model.block_params * (pd + (rd if rd != pd else 0))
    if train.reshard_after_forward:
        blocks = 2 * model.block_params * pd          # the unit computing and the one prefetched
    else:
        blocks = model.layers * model.block_params * pd
    gathered = model.root_params * pd + blocks + unit_grads
    if not train.sync_every_microbatch and train.grad_accum > 1:
        gathered += model.total_params * rd   # unsharded gradients kept across micro-batches
    act_no, act_ac = activation_bytes(model, train, False), activation_bytes(model, train, True)
    mode = checkpointing(train)
    act = {"none": act_no, "full": act_ac}.get(mode.mode) or activation_bytes(model, train, mode.label)
    total = sharded + gathered + (act or 0.0)
    fits = None if capacity_bytes is None else total <= capacity_bytes
    return MemoryCheck(sharded, gathered, act, act_no, act_ac, total, capacity_bytes, fits)
