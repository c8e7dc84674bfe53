"""Full and hybrid sharding (FSDP2's `fully_shard`, on a 1-D or a 2-D device mesh) over two
networks: the step and the memory per GPU of each.

  full        : every unit sharded over the whole world; AllGather and ReduceScatter over all
                ranks, across nodes on both levels (compose/levels.py), or on a measured world
                curve when the record has one (as one-level `--nccl` is used).
  hybrid[:G]  : sharded over G ranks (default: the ranks of one node), replicated over the
                world / G groups of ranks at the same place in their shard group (HSDP).
                AllGather and ReduceScatter run in the shard group, as full sharding does at G
                ranks (fsdp.predict_step); then each unit's gradient shard (its bytes / G) is
                all-reduced over the replicas (a ReduceScatter and an AllGather, or the cross
                groups' measured all-reduce where they are as measured), once per step, on the
                last micro-batch's backward (FSDP2 with set_requires_all_reduce(False) on the
                others; `allreduce_every_microbatch` for its default), issued after the unit's
                ReduceScatter and run on the NICs while the earlier blocks' backward and their
                NVLink collectives go on: a queue on the inter level, whose tail past the end of
                backward (the first block's and the root's all-reduce, or more when the queue
                falls behind) is exposed, before the optimizer step. When the shard group itself
                crosses nodes (G > ranks per node) the two share the NICs, so the all-reduce is
                counted unhidden.
                Memory: the sharded fp32 state is world / G times full sharding's; the optimizer
                step runs over 1/G of the parameters.
Group shapes (ranks per node R, N nodes, world = N x R; G divides R or is a multiple of it):
  shard group : G <= R: inside one node; G > R: G / R whole nodes (a ring across them).
  replicas    : world / G ranks; G < R: R / G of them on each node, G such groups crossing each
                node's NICs at once; G >= R: one per node, R groups at once; one node: intra.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from ...core.errors import UsageError
from ..curves import Network
from ..fsdp import MemoryCheck, StepPrediction, TrainSpec, compute_times, memory_check, predict_step, unit_bytes
from ..levels import GroupCurve, Levels

STRATEGIES = ("full", "hybrid")


@dataclass(frozen=True)
class Strategy:
    name: str                 # full | hybrid
    shard_ranks: int | None   # G as given; None: full = the world, hybrid = the ranks of one node

    @property
    def text(self) -> str:
        return self.name if self.shard_ranks is None else f"{self.name}:{self.shard_ranks}"

    def resolve(self, world: int, ranks_per_node: int) -> int:
        """G for this job, refused (exit 2, one line with the numbers) when it cannot be."""
        if self.name == "full":
            return world
        g = ranks_per_node if self.shard_ranks is None else self.shard_ranks
        layout = (
            f"{world // ranks_per_node} nodes x {ranks_per_node}" if world % ranks_per_node == 0 else f"{world} ranks"
        )
        if g > world or world % g:
            raise UsageError(f"--sharding {self.text}: a shard group of {g} ranks "
                             f"{'is larger than' if g > world else 'does not divide'} the world of {world} ranks "
                             f"({layout}); expected a divisor of {world}, e.g. hybrid:{min(ranks_per_node, world)}")
        if ranks_per_node % g and g % ranks_per_node:
            raise UsageError(f"--sharding {self.text}: a shard group of {g} ranks straddles nodes of {ranks_per_node} "
                             f"ranks ({layout}); expected a divisor or a multiple of {ranks_per_node}, "
                             f"e.g. hybrid:{ranks_per_node}")
        return g


def parse_sharding(text: str) -> list[Strategy]:
    """`full`, `hybrid`, `hybrid:G`, comma-separated (the what-if)."""
    out: list[Strategy] = []
    for part in [p.strip() for p in str(text).split(",")]:
        name, sep, size = part.partition(":")
        if name not in STRATEGIES or (sep and name == "full"):
            raise UsageError(f"invalid --sharding {part!r}: expected full, hybrid or hybrid:G (G ranks per shard "
                             f"group), comma-separated, e.g. --sharding full,hybrid,hybrid:4")
        g = None
        if sep:
            if not size.isdigit() or int(size) < 1:
                raise UsageError(f"invalid --sharding {part!r}: G must be a positive whole number of ranks, "
                                 f"e.g. hybrid:8")
            g = int(size)
        if any(s == Strategy(name, g) for s in out):
            raise UsageError(f"--sharding {text!r} names {part!r} twice; give each once, e.g. full,hybrid")
        out.append(Strategy(name, g))
    return out


@dataclass(frozen=True)
class ShardedStep:
    strategy: str                  # full, hybrid:8, ...
    shard_ranks: int               # G
    replicas: int                  # world / G
    step: StepPrediction           # the whole step: the replicas' all-reduce included in step_s
    allreduce_s: float             # the replicas' gradient all-reduce, per step, all units
    exposed_allreduce_s: float     # of it, past the end of backward
    memory: MemoryCheck
    notes: tuple[str, ...]

    def as_dict(self) -> dict[str, Any]:
        step = self.step.as_dict()
        step["notes"] = list(step["notes"])
        return {"strategy": self.strategy, "shard_ranks": self.shard_ranks, "replicas": self.replicas, **step,
                "allreduce_s": self.allreduce_s, "exposed_allreduce_s": self.exposed_allreduce_s,
                "memory": self.memory.as_dict(), "fits_in_memory": self.memory.fits}


def _geometry(world: int, per_node: int, g: int) -> tuple[tuple[int, int], tuple[int, int, int]]:
    """((shard group's nodes, sharing), (replicas, their nodes, sharing))."""
    nodes = max(1, world // per_node)
    shard = (1, 1) if g <= per_node else (g // per_node, 1)
    m = world // g
    if nodes == 1 or m == 1:
        return shard, (m, 1, 1)
    if g < per_node:
        return shard, (m, nodes, g)
    return shard, (m, m, per_node)


def predict_sharding(model: Any, train: TrainSpec, levels: Levels | None, *, ranks_per_node: int, shard_ranks: int,
                     capacity_bytes: float | None = None, world_network: Network | None = None,
                     allreduce_every_microbatch: bool = False) -> ShardedStep:
    """The step and memory per GPU of `train.ranks` ranks, `ranks_per_node` per node, sharded over
    groups of `shard_ranks` (= train.ranks: full sharding) and replicated over the rest.
    `levels`: the two networks (None: full sharding on `world_network` only); `world_network`: a
    one-level curve of the world's collectives, used for full sharding when given."""
    world, per_node, g = train.ranks, ranks_per_node, shard_ranks
    if per_node < 1 or g < 1 or world % g or (world > per_node and world % per_node):
        raise UsageError(f"no sharding of {world} ranks ({per_node} per node) in groups of {g}; expected G to "
                         f"divide the world and the world to be whole nodes, e.g. 16 ranks, 8 per node, G 8")
    label = "full" if g == world else f"hybrid:{g}"
    if g == world and world_network is not None:
        step = predict_step(model, train, world_network.all_gather, world_network.reduce_scatter)
        return ShardedStep(label, g, 1, step, 0.0, 0.0, memory_check(model, train, capacity_bytes), step.notes)
    if levels is None:
        raise UsageError(f"--sharding {label} needs the two networks: give --net-intra and --net-inter (e.g. "
                         f"--net-intra 360GB/s --net-inter 1.25GB/s) or an `nccl --groups world,node,cross` record")
    (shard_nodes, shard_sharing), (m, rep_nodes, rep_sharing) = _geometry(world, per_node, g)
    ag, rs = (GroupCurve(levels, op, per_node, shard_nodes, shard_sharing) for op in ("all_gather", "reduce_scatter"))
    shard_train = dataclasses.replace(train, ranks=g)
    base = predict_step(model, shard_train, ag, rs)
    memory = memory_check(model, shard_train, capacity_bytes)
    if m == 1:
        return ShardedStep(label, g, 1, base, 0.0, 0.0, memory, base.notes)

    notes = set(base.notes)

    def allreduce(unit: str) -> float:
        size = unit_bytes(model, unit, "all_reduce", train.param_dtype, train.reduce_dtype)
        if size <= 0:
            return 0.0
        t, how = levels.all_reduce_time_s(size / g, m, rep_nodes, rep_sharing)   # the gradient shard
        notes.add(f"allreduce {how}")
        return t

    ar_block, ar_root = allreduce("block"), allreduce("root")
    ar_total = model.layers * ar_block + ar_root
    exposed = _exposed_allreduce(model, shard_train, ag, rs, ar_block, ar_root)
    if shard_nodes > 1:
        exposed = ar_total   # the shard group's collectives use the same NICs
    exposed = train.overlap * exposed + (1 - train.overlap) * ar_total
    rounds = train.grad_accum if allreduce_every_microbatch else 1
    ar_total, exposed = rounds * ar_total, rounds * exposed
    step_s = base.step_s + exposed
    tokens = train.tokens_per_rank * train.grad_accum * world
    step = dataclasses.replace(
        base, step_s=step_s, no_overlap_s=base.no_overlap_s + ar_total,
        full_overlap_s=max(base.full_overlap_s, ar_total + base.optimizer_s + base.fsdp_overhead_s),
        exposed_comm_s=base.exposed_comm_s + exposed, tokens_per_s=tokens / step_s, notes=tuple(sorted(notes)))
    return ShardedStep(label, g, m, step, ar_total, exposed, memory, step.notes)


def _exposed_allreduce(model: Any, train: TrainSpec, ag: GroupCurve, rs: GroupCurve, ar_block: float,
                       ar_root: float) -> float:
    """The all-reduce queue's tail past the end of the last micro-batch's backward, with the
    backward paced as fsdp.predict_step paces it (root's backward, then per block the larger of
    its compute and its AllGather + ReduceScatter, the root's ReduceScatter last)."""
    g = train.ranks
    c = compute_times(model, train)

    def size(unit: str, op: str) -> float:
        return unit_bytes(model, unit, op, train.param_dtype, train.reduce_dtype)

    ag_b = ag.time_s(size("block", "all_gather"), g)[0] if train.reshard_after_forward and g > 1 else 0.0
    rs_b = rs.time_s(size("block", "reduce_scatter"), g)[0] if g > 1 else 0.0
    rs_root = rs.time_s(size("root", "reduce_scatter"), g)[0] if g > 1 and model.root_params else 0.0
    t = max(c["root_bwd"], ag_b)
    queue = 0.0
    for block in range(model.layers):
        last = block == model.layers - 1
        t += (c["block_bwd"] + rs_b) if last else max(c["block_bwd"], ag_b + rs_b)
        queue = max(queue, t) + ar_block
    t += rs_root
    queue = max(queue, t) + ar_root
    return max(0.0, queue - t)
