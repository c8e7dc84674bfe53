"""Two networks in every cluster: between one node's GPUs (NVLink: the intra level) and between
nodes (the NICs: the inter level), and what a collective over a group of ranks costs on them.

Inputs (Levels):
  intra: a collective among one node's ranks: `nccl --groups node` (every node's group at once),
         or --net-intra BUSBW[@LAT], the nccl-tests bus bandwidth among a node's GPUs (360GB/s).
  inter: a collective across nodes, one rank per node per group: `nccl --groups cross` (all
         ranks-per-node such groups at once, sharing each node's NICs, as HSDP runs them), or
         --net-inter BW[@LAT]: what one node has to the others, all its NICs together, one
         direction (1.25GB/s for 10 Gbit Ethernet, 400GB/s for 8 x 400G InfiniBand).
  A node's inter bandwidth is the cross curve's bus bandwidth times the groups that shared the
  node's NICs when it was measured (the record's ranks per node), or --net-inter as given.

The cost of one collective (AllGather, ReduceScatter; an all-reduce is one of each) of S bytes
(nccl-tests' size) over a group of m ranks spanning `nodes` nodes, while `sharing` such groups
cross each node's NICs at once:
  nodes = 1    : the intra curve at m ranks (measured, interpolated or rescaled, as curves.py).
  nodes > 1    : a ring, as NCCL runs these: t = latency + S x (m-1)/m / busbw, with
                 busbw = min(intra busbw, node inter bandwidth / sharing). Each ring crosses each
                 node's boundary once and carries (m-1)/m x S on every link; NCCL spreads its
                 rings (channels) over the node's NICs, so the node's NICs carry what one rank's
                 link does, and the slower level bounds it (the inter-node step is the bytes per
                 rank over the rank's share of the NICs). Latency: the larger of the two levels'.
                 One rank per node, the record's node count and groups at once: the cross curve
                 itself (measured or interpolated), as a one-level curve is used.
Pure: numbers in, numbers out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..core.errors import UsageError
from ..core.units import bus_factor
from .curves import Curve, Network, network_from_record, record_rows, synthetic_network

GROUPS = ("world", "node", "cross")


@dataclass(frozen=True)
class Levels:
    intra: Network
    inter: Network
    inter_groups: int = 1                 # cross groups that shared a node's NICs when `inter` was measured
    source: str = ""
    inter_all_reduce: Curve | None = None  # the cross groups' all-reduce, when measured

    def curve(self, level: str, op: str) -> Curve:
        net = self.intra if level == "intra" else self.inter
        return net.all_gather if op == "all_gather" else net.reduce_scatter

    def node_inter_gbps(self, op: str) -> float:
        """One node's bandwidth to the others, all its NICs together."""
        return self.curve("inter", op).peak_busbw_gbps * self.inter_groups

    def intra_gbps(self, op: str) -> float:
        return self.curve("intra", op).peak_busbw_gbps

    def group_time_s(self, op: str, size_bytes: float, ranks: int, nodes: int, sharing: int = 1) -> tuple[float, str]:
        """One collective over `ranks` ranks on `nodes` nodes, `sharing` groups crossing each node's
        NICs at once; and how it was costed."""
        if ranks <= 1 or size_bytes <= 0:
            return 0.0, "nothing to move"
        if nodes <= 1:
            t, how = self.curve("intra", op).time_s(size_bytes, ranks)
            return t, f"on the intra level ({self.intra.name}): {how}"
        cross = self.curve("inter", op)
        if ranks == nodes and cross.points and cross.ranks == nodes and sharing == self.inter_groups:
            t, how = cross.time_s(size_bytes)
            return t, f"on the inter level ({self.inter.name}), cross groups as measured: {how}"
        share = self.node_inter_gbps(op) / max(1, sharing)
        busbw, latency = share, cross.latency_s
        if ranks > nodes:   # more than one rank per node: the ring's links inside a node too
            intra = self.curve("intra", op)
            busbw, latency = min(share, intra.peak_busbw_gbps), max(latency, intra.latency_s)
        t = latency + size_bytes * bus_factor(op, ranks) / (busbw * 1e9)
        shared = f" / {sharing} groups" if sharing > 1 else ""
        inter = f"node inter {self.node_inter_gbps(op):,.4g} GB/s{shared}"
        if ranks > nodes:
            return t, (f"two-level ring over {nodes} nodes x {ranks // nodes}: busbw min(intra "
                       f"{self.intra_gbps(op):,.4g}, {inter}) = {busbw:,.4g} GB/s, latency {latency * 1e6:.4g} us")
        return (
            t,
            f"ring over {nodes} nodes, one rank each: busbw {inter} = {busbw:,.4g} GB/s, "
            f"latency {latency * 1e6:.4g} us",
        )

    def all_reduce_time_s(self, size_bytes: float, ranks: int, nodes: int, sharing: int = 1) -> tuple[float, str]:
        """A ring all-reduce moves one ReduceScatter and one AllGather; the cross groups' own
        all-reduce curve where the groups are as it was measured."""
        curve = self.inter_all_reduce
        if (curve is not None and curve.points and ranks == nodes == curve.ranks and sharing == self.inter_groups
                and size_bytes > 0):
            t, how = curve.time_s(size_bytes)
            return t, f"on the inter level ({self.inter.name}), cross groups' all_reduce as measured: {how}"
        rs, how_rs = self.group_time_s("reduce_scatter", size_bytes, ranks, nodes, sharing)
        ag, how_ag = self.group_time_s("all_gather", size_bytes, ranks, nodes, sharing)
        return rs + ag, f"as a reduce_scatter and an all_gather: {how_rs}" + ("" if how_ag == how_rs else f"; {how_ag}")

    def describe(self) -> dict[str, Any]:
        return {"intra": self.intra.describe(), "inter": self.inter.describe(), "inter_groups": self.inter_groups,
                "node_inter_gbps": {op: self.node_inter_gbps(op) for op in ("all_gather", "reduce_scatter")},
                "source": self.source}


@dataclass(frozen=True)
class GroupCurve:
    """A collective over groups of one shape on two levels, as fsdp.predict_step asks a curve
    (`time_s(size_bytes, ranks)`, `latency_s`): `nodes` spanned by each group, `sharing` groups
    crossing each node's NICs at once. With nodes = None the group spans ranks / ranks_per_node
    nodes (the world's collective, full sharding)."""
    levels: Levels
    op: str
    ranks_per_node: int
    nodes: int | None = None
    sharing: int = 1
    ranks: int = 0                        # the world the curve was measured at, for `compose` (0: described)
    points: tuple = ()

    def _nodes(self, ranks: int) -> int:
        return self.nodes if self.nodes is not None else max(1, math.ceil(ranks / self.ranks_per_node))

    @property
    def latency_s(self) -> float:
        intra, inter = self.levels.curve("intra", self.op), self.levels.curve("inter", self.op)
        return inter.latency_s if self.nodes is None or self.nodes > 1 else intra.latency_s

    @property
    def peak_busbw_gbps(self) -> float:
        """The busbw of a world collective across nodes: the slower level's."""
        return min(self.levels.intra_gbps(self.op), self.levels.node_inter_gbps(self.op) / self.sharing)

    def time_s(self, size_bytes: float, ranks: int | None = None) -> tuple[float, str]:
        ranks = ranks or self.ranks
        return self.levels.group_time_s(self.op, size_bytes, ranks, self._nodes(ranks), self.sharing)


def two_level_network(name: str, levels: Levels, ranks_per_node: int, *, world: Network | None = None,
                      measured_world: int = 0) -> Network:
    """A network given as two levels, seen as one (the world's collective: full sharding across
    nodes) by every table that takes one; `world`: a measured world curve, used as is for that."""
    if world is not None:
        return Network(name, world.all_gather, world.reduce_scatter, world.source, world.backend, world.device,
                       world.warnings, levels)
    ag, rs = (GroupCurve(levels, op, ranks_per_node, ranks=measured_world) for op in ("all_gather", "reduce_scatter"))
    warnings = levels.intra.warnings + levels.inter.warnings
    backend = levels.inter.backend
    return Network(name, ag, rs, levels.source, backend, levels.inter.device, warnings, levels)  # type: ignore[arg-type]


def described_levels(name: str, intra_gbps: float, intra_latency_s: float, inter_gbps: float,
                     inter_latency_s: float, source: str) -> Levels:
    """--net-intra and --net-inter: the intra bus bandwidth, and one node's NICs together."""
    return Levels(synthetic_network(f"{name}:intra", intra_gbps, intra_latency_s, source),
                  synthetic_network(f"{name}:inter", inter_gbps, inter_latency_s, source), 1, source)


def record_groups(record: dict[str, Any], source: str = "") -> set[str]:
    return {str(r.get("group", "world")) for r in record_rows(record, source) if r.get("op")}


def _group_ranks(record: dict[str, Any], group: str, source: str) -> int:
    sizes = {r.get("ranks") for r in record_rows(record, source) if r.get("group") == group}
    sizes.discard(None)
    if len(sizes) == 1:
        (size,) = sizes
        if isinstance(size, int) and not isinstance(size, bool) and size > 0:
            return size
    topology: dict[str, Any] = {}
    for where in (record, record.get("config") or {}, record.get("summary") or {}):
        if isinstance(where, dict) and isinstance(where.get("topology"), dict):
            topology = where["topology"]
            break
    key = "ranks_per_node" if group == "node" else "nodes"
    value = topology.get(key)
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    raise UsageError(f"the collective record {source!r} has {group!r} rows but no group size (rows' `ranks`, or "
                     f"topology.{key}); re-run `microbench nccl --groups world,node,cross`")


def levels_from_record(record: dict[str, Any], name: str, source: str, *, allow_partial: bool = False,
                       for_gpus: bool = True) -> Levels | None:
    """The node and cross curves of a `nccl --groups ...,node,cross` record; None when it has not
    both."""
    groups = record_groups(record, source)
    if not {"node", "cross"} <= groups:
        return None
    nets = {}
    for group in ("node", "cross"):
        size = _group_ranks(record, group, source)   # the group's ranks, not the world's
        view = dict(record, rows=[dict(r, group="world", ranks=r.get("ranks") or size)
                                  for r in record_rows(record, source) if r.get("group") == group])
        nets[group] = network_from_record(view, f"{name}:{group}", f"{source} ({group} group)",
                                          allow_partial=allow_partial, for_gpus=for_gpus)
    cross_rows = [dict(r, group="world", ranks=r.get("ranks") or _group_ranks(record, "cross", source))
                  for r in record_rows(record, source) if r.get("group") == "cross"]
    all_reduce = None
    if any(r.get("op") == "all_reduce" for r in cross_rows):
        all_reduce = Curve.from_record(dict(record, rows=cross_rows), "all_reduce", f"{source} (cross group)")
    return Levels(nets["node"], nets["cross"], _groups_at_once(record, source), f"{source} (node and cross groups)",
                  all_reduce)


def _groups_at_once(record: dict[str, Any], source: str) -> int:
    """How many cross groups shared each node's NICs: the rows' `groups_at_once` as `nccl --groups`
    writes it, else one per rank of a node (as it runs them)."""
    counts = {r.get("groups_at_once") for r in record_rows(record, source) if r.get("group") == "cross"}
    if len(counts) == 1:
        (count,) = counts
        if isinstance(count, int) and not isinstance(count, bool) and count > 0:
            return count
    return _group_ranks(record, "node", source)
