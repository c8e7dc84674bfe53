"""The sharding what-if: strategy x network at the job's node count, and at other node counts
from the same curves (--scale-nodes), with the step, the memory verdict and the ratio to the
best; the rows as compose's record keeps them and as its tables print them. Pure."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

from ..curves import Network
from ..fsdp import TrainSpec
from .inputs import ShardingPlan
from .predict import ShardedStep, predict_sharding

SCALE_METHOD = ("scaled from the same curves: each level's fitted latency and peak busbw (core/fit over the measured "
                "sizes, compose/curves.py), the bus factor at the new group size, each node keeping its NICs (the "
                "node's inter bandwidth held) and the latency held at its fit (a ring's grows with its ranks: "
                "optimistic for small messages at many nodes); per-rank batch held (weak scaling); a cross group "
                "at the measured node count uses its measured curve")


@dataclass(frozen=True)
class ShardingRow:
    nodes: int
    ranks: int
    network: str
    strategy: str
    result: ShardedStep | None        # None: not predictable here (`why`)
    why: str = ""
    ratio: float | None = None        # step over the best step that fits, at the same node count

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"op": "sharding", "network": self.network, "strategy": self.strategy,
                               "nodes": self.nodes, "ranks": self.ranks, "ratio": self.ratio}
        if self.result is None:
            return {**out, "skipped": self.why}
        return {**out, **self.result.as_dict()}


def _one(model: Any, train: TrainSpec, net: Network, strategy: Any, per_node: int, capacity: float | None,
         nodes: int, scaled: bool) -> ShardingRow:
    world = train.ranks
    label = strategy.text
    if strategy.name == "hybrid" and net.levels is None:
        return ShardingRow(nodes, world, net.name, label, None, "one level (the world's collective): hybrid needs "
                           "--net-intra/--net-inter or an `nccl --groups world,node,cross` record")
    try:
        g = strategy.resolve(world, per_node)
    except Exception as e:   # a shard group that fits the job but not this node count
        return ShardingRow(nodes, world, net.name, label, None, str(e).partition(": ")[2] or str(e))
    # Full sharding: at the job's size the network as the step table used it (a measured world
    # curve as today); scaled, the two levels' fits when there are two.
    whole = None if (scaled and net.levels is not None) else net
    result = predict_sharding(model, train, net.levels, ranks_per_node=per_node, shard_ranks=g,
                              capacity_bytes=capacity, world_network=whole if g == world else None)
    return ShardingRow(nodes, world, net.name, label if strategy.name == "full" else result.strategy, result)


def _ratios(rows: list[ShardingRow]) -> list[ShardingRow]:
    """The ratio to the best step that fits in memory (to the best of all when none does)."""
    done = [(r, r.result) for r in rows if r.result is not None]
    fitting = [(r, s) for r, s in done if s.memory.fits is not False] or done
    best = min((s.step.step_s for _, s in fitting), default=None)
    return [dataclasses.replace(r, ratio=r.result.step.step_s / best) if r.result is not None and best else r
            for r in rows]


def _at(model: Any, train: TrainSpec, nets: list[Network], plan: ShardingPlan, capacity: float | None,
        scaled: bool) -> list[ShardingRow]:
    """Every strategy x network at train.ranks; a strategy that comes to the same shard group as
    one before it (hybrid on one node is full sharding) is not repeated."""
    nodes = max(1, train.ranks // plan.ranks_per_node)
    rows, seen = [], set()
    for strategy in plan.strategies:
        for net in nets:
            row = _one(model, train, net, strategy, plan.ranks_per_node, capacity, nodes, scaled)
            key = (net.name, row.result.shard_ranks if row.result is not None else row.strategy)
            if key not in seen:
                seen.add(key)
                rows.append(row)
    return _ratios(rows)


def whatif(model: Any, train: TrainSpec, nets: list[Network], plan: ShardingPlan,
           capacity: float | None) -> list[ShardingRow]:
    return _at(model, train, nets, plan, capacity, False)


def scale(model: Any, train: TrainSpec, nets: list[Network], plan: ShardingPlan,
          capacity: float | None) -> list[ShardingRow]:
    out: list[ShardingRow] = []
    for nodes in plan.scale_nodes:
        at = dataclasses.replace(train, ranks=nodes * plan.ranks_per_node)
        # the job's own node count: the rows of the what-if above, as they were predicted there
        out += _at(model, at, nets, plan, capacity, at.ranks != train.ranks)
    return out


def verdict(result: ShardedStep, fmt_bytes: Callable[[float], str]) -> str:
    memory = result.memory
    if memory.fits is None:
        return f"{fmt_bytes(memory.total_bytes)} (no --gpu)"
    capacity = memory.capacity_bytes
    assert capacity is not None   # fits is judged against it
    if memory.fits:
        return f"fits: {fmt_bytes(memory.total_bytes)} of {fmt_bytes(capacity)}"
    return f"DOES NOT FIT: {fmt_bytes(memory.total_bytes)} of {fmt_bytes(capacity)}"


HEADERS = ["sharding", "network", "step", "tokens/s", "exposed comm", "all-reduce across replicas (exposed)",
           "memory per GPU", "vs best"]


def table(rows: list[ShardingRow], fmt_time: Callable[[float], str], fmt_bytes: Callable[[float], str],
          with_nodes: bool = False) -> list[list[str]]:
    out = []
    for r in rows:
        head = ([str(r.nodes), str(r.ranks)] if with_nodes else []) + [r.strategy, r.network]
        if r.result is None:
            out.append(head + ["-", "-", "-", "-", f"not predicted: {r.why}", "-"])
            continue
        s = r.result
        ar = f"{fmt_time(s.allreduce_s)} ({fmt_time(s.exposed_allreduce_s)})" if s.replicas > 1 else "-"
        out.append(head + [fmt_time(s.step.step_s), f"{s.step.tokens_per_s:,.0f}", fmt_time(s.step.exposed_comm_s),
                           ar, verdict(s, fmt_bytes), f"{r.ratio:.2f}x" if r.ratio else "-"])
    return out


def notes(rows: list[ShardingRow]) -> list[str]:
    """How each strategy's collectives were costed, once per (network, strategy)."""
    how_by_row: dict[tuple[str, str], dict[str, list[str]]] = {}
    for r in rows:
        if r.result is None:
            continue
        how = how_by_row.setdefault((r.network, r.strategy), {})
        for note in r.result.notes:
            op, _, text = note.partition(" ")
            if op not in how.setdefault(text, []):
                how[text].append(op)
    return [f"{net} {strategy}: {' and '.join(ops)} {text}"
            for (net, strategy), how in how_by_row.items() for text, ops in how.items()]


def memory_notes(rows: list[ShardingRow], fmt_bytes: Callable[[float], str]) -> list[str]:
    """Per strategy, once: the sharded state it keeps per GPU against full sharding's, and what to
    change when it does not fit."""
    full = next((r.result for r in rows if r.result is not None and r.result.replicas == 1), None)
    out: list[str] = []
    for r in rows:
        s = r.result
        if s is None or s.replicas == 1 or any(line.startswith(f"{r.strategy} ") for line in out):
            continue
        line = (f"{r.strategy} keeps {fmt_bytes(s.memory.sharded_state_bytes)} of fp32 params, grads and AdamW per GPU "
                f"({s.replicas}x full sharding's"
                + (f" {fmt_bytes(full.memory.sharded_state_bytes)}" if full is not None else "") + ")")
        if s.memory.fits is False:
            line += ("; it DOES NOT FIT: a larger shard group (hybrid:G), activation checkpointing or a smaller "
                     "micro-batch")
        out.append(line)
    return out
