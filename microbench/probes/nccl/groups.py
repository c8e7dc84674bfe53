"""`--groups world,node,cross`: the collective over the whole world, within each node, and across
nodes, in one run.

A node group holds one node's ranks; a cross group one rank of every node (world/topology.py).
Every rank belongs to exactly one group of each kind, so when every rank runs the collective on
its own node group, all nodes' groups run at once, and likewise all cross groups: as HSDP runs
them (shard within a node, replicate across), the cross groups sharing each node's NICs. One
cross group measured alone would get the whole NIC and overstate what each gets under HSDP.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from ...core.errors import UsageError
from ...core.probe import RankGroup
from ...expect.formulas import expected_busbw, inter_node_gbps, known, lab_link, unknown
from ...world.topology import Topology

GROUPS = ("world", "node", "cross")
WORLD = "world"


def check_groups(groups: list[str], topo: Topology) -> None:
    """Refuse a group this world cannot form (exit 2), naming the numbers."""
    if "cross" in groups and topo.nodes < 2:
        raise UsageError(f"invalid --groups cross: this world of {topo.nodes * topo.ranks_per_node} ranks is one node "
                         f"({topo.ranks_per_node} ranks per node, from {topo.source}), and a cross-node group needs "
                         f"2 or more nodes; drop cross, e.g. --groups world,node, or run on 2 or more nodes")
    if "node" in groups and topo.ranks_per_node < 2:
        raise UsageError(f"invalid --groups node: each of the {topo.nodes} nodes runs 1 rank (from {topo.source}), "
                         f"and a node group needs 2 or more ranks; drop node, e.g. --groups world,cross")


@dataclass
class Group:
    """This rank's group of one kind: the process group (None: the world's), its members as
    global ranks, this rank's index among them, and how many such groups run at once."""

    name: str
    pg: Any
    members: list[int]
    rank: int
    concurrent: int
    ops: dict[str, Callable[..., Any]] = field(default_factory=dict)

    @property
    def size(self) -> int:
        return len(self.members)


def make_groups(dist: Any, names: list[str], world: RankGroup, topo: Topology | None) -> dict[str, Group]:
    """This rank's Group of every kind asked for. Every rank creates every subgroup, in the same
    order (torch's new_group is collective over the whole world). The world group is the world's
    own process group: the default one, or a sub-world's (`world.group`, `world.ranks`: hunt
    --bisect measures halves of the hosts at once)."""
    world_rank, world_size = world.rank, world.size
    out: dict[str, Group] = {}
    for name in names:
        if name == WORLD:
            members = list(getattr(world, "ranks", None) or range(world_size))
            out[name] = Group(WORLD, getattr(world, "group", None), members, world_rank, 1)
            continue
        assert topo is not None
        layout = topo.node_groups() if name == "node" else topo.cross_groups()
        mine, _ = dist.new_subgroups_by_enumeration(layout)
        members = next(g for g in layout if world_rank in g)
        out[name] = Group(name, mine, members, members.index(world_rank), len(layout))
    return out


def expected_for_group(facts: dict[str, Any], op: str, group: str, topo: Topology, device: str,
                       transport: str) -> dict[str, Any]:
    """What one group of this kind should reach while all groups of its kind run at once."""
    per_node = topo.ranks_per_node
    layout = {"group": group, "nodes": topo.nodes, "ranks_per_node": per_node, "device": device, "op": op}
    if group == "node":
        if facts.get("lab"):
            out = unknown("the ranks of one lab host talk over its own loopback, unshaped, which has no line "
                          "rate (the lab's links are between hosts)")
        else:
            out = expected_busbw(facts, op, nodes=1, ranks_per_node=per_node, device=device, transport=transport)
        return {**out, "layout": layout}
    # cross: one rank per node per group, the node's ranks_per_node groups sharing its NICs.
    whole = lab_link(facts) if facts.get("lab") else inter_node_gbps(facts, device, per_node, transport)
    if whole["gbps"] is None:
        return {**whole, "layout": layout}
    share = known(whole["gbps"] / per_node, f"({whole['formula']}) / ranks_per_node (the node's cross groups "
                  f"share its {'link' if facts.get('lab') else 'NICs'})", whole["limit"], **whole["inputs"],
                  ranks_per_node=per_node)
    return {**share, "layout": layout}
