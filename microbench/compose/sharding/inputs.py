"""Two networks and sharding as the composer takes them: --net-intra / --net-inter (described
levels), `nccl --groups world,node,cross` records (measured levels), and the what-if's plan from
--sharding (the strategies) and --scale-nodes (other node counts), checked against the job. A
one-level --net or --nccl keeps its meaning: the world's collective, full sharding."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...core.errors import UsageError
from ...core.units import parse_bandwidth_bytes_per_s, parse_duration_s
from ..curves import Network, network_from_record
from ..levels import described_levels, levels_from_record, record_groups, two_level_network
from .predict import Strategy

EXAMPLE = "--net-intra 360GB/s --net-inter 1.25GB/s"


@dataclass(frozen=True)
class Level:
    """--net-intra or --net-inter: [NAME=]BW[@LATENCY]."""
    name: str             # "" when not named
    gbps: float
    latency_s: float
    rate: str             # the bandwidth as written
    text: str


def parse_level(text: str, flag: str) -> Level:
    name, sep, spec = str(text).partition("=")
    if not sep:
        name, spec = "", str(text)
    rate, _, latency = spec.partition("@")
    if not rate.strip() or (sep and not name.strip()):
        raise UsageError(f"invalid {flag} {text!r}: expected [NAME=]BW[@LATENCY], e.g. {flag} "
                         f"{'360GB/s' if flag == '--net-intra' else 'eth=1.25GB/s@50us'}")
    gbps = parse_bandwidth_bytes_per_s(rate, what=f"{flag} bandwidth") / 1e9
    lat = parse_duration_s(latency, what=f"{flag} latency", example="30us") if latency else 0.0
    return Level(name.strip(), gbps, lat, rate.strip(), str(text))


def described(intra: list[Level], inter: list[Level]) -> list[Network]:
    """Two-level networks from --net-intra and --net-inter: one --net-intra goes with every
    --net-inter (a what-if over the NICs), or as many of each, paired in order. Until `for_job`
    knows the ranks per node, the full-sharding view assumes one node."""
    if not intra and not inter:
        return []
    if not intra or not inter:
        given, missing = ("--net-intra", "--net-inter") if intra else ("--net-inter", "--net-intra")
        raise UsageError(f"{given} needs {missing}: the two levels go together (the NVLink bus bandwidth inside a "
                         f"node and one node's NICs to the others), e.g. {EXAMPLE}")
    if len(intra) != 1 and len(intra) != len(inter):
        raise UsageError(f"{len(intra)} --net-intra for {len(inter)} --net-inter: give one --net-intra for all, or "
                         f"one per --net-inter (paired in order), e.g. --net-intra 360GB/s --net-inter eth=1.25GB/s "
                         f"--net-inter ib=400GB/s")
    out = []
    for index, level in enumerate(inter):
        near = intra[0] if len(intra) == 1 else intra[index]
        name = level.name or f"inter {level.rate}"
        source = f"--net-intra {near.text} --net-inter {level.text}"
        levels = described_levels(name, near.gbps, near.latency_s, level.gbps, level.latency_s, source)
        out.append(two_level_network(name, levels, 1))
    return out


def record_network(record: dict[str, Any], name: str, source: str, *, allow_partial: bool,
                   for_gpus: bool) -> Network:
    """A --nccl record: its world curve as today, with the node and cross groups' levels when it
    has them (`nccl --groups`); a record of node and cross groups only is seen as two levels."""
    levels = levels_from_record(record, name, source, allow_partial=allow_partial, for_gpus=for_gpus)
    if levels is not None and "world" not in record_groups(record, source):
        per_node = levels.intra.all_gather.ranks
        return two_level_network(name, levels, per_node, measured_world=per_node * levels.inter.all_gather.ranks)
    net = network_from_record(record, name, source, allow_partial=allow_partial, for_gpus=for_gpus)
    return net if levels is None else two_level_network(name, levels, 1, world=net)


def ranks_per_node(nets: list[Network], world: int, nodes: int | None) -> int | None:
    """The job's ranks per node: --nodes given, the world over it; else a grouped record's."""
    if nodes:
        return world // nodes
    measured = [
        n.levels.intra.all_gather.ranks for n in nets if n.levels is not None and n.levels.intra.all_gather.ranks
    ]
    if measured and world % measured[0] == 0:
        return measured[0]
    return None


def for_job(nets: list[Network], world: int, nodes: int | None) -> list[Network]:
    """Two-level networks' full-sharding view for this job's ranks per node."""
    if not any(n.levels is not None for n in nets):
        return nets
    per_node = ranks_per_node(nets, world, nodes)
    if per_node is None:
        raise UsageError(f"two networks (intra and inter node) need the job's nodes: give --nodes and --gpus-per-node, "
                         f"e.g. --nodes {max(1, world // 8)} --gpus-per-node 8 (not --ranks {world} alone)")
    out = []
    for net in nets:
        if net.levels is None or hasattr(net.all_gather, "points") and net.all_gather.points:
            out.append(net)
            continue
        measured = getattr(net.all_gather, "ranks", 0)
        out.append(two_level_network(net.name, net.levels, per_node, measured_world=measured))
    return out


@dataclass(frozen=True)
class ShardingPlan:
    strategies: tuple[Strategy, ...]
    ranks_per_node: int
    scale_nodes: tuple[int, ...]


def plan(strategies: tuple[Strategy, ...] | None, scale_nodes: tuple[int, ...] | None, nets: list[Network],
         world: int, nodes: int | None) -> ShardingPlan | None:
    """What the sharding what-if runs, checked against the job (exit 2 on a shard group that
    does not fit it); None when neither --sharding nor --scale-nodes was given."""
    if not strategies and not scale_nodes:
        return None
    strategies = strategies or (Strategy("full", None),)
    per_node = ranks_per_node(nets, world, nodes)
    two_level = [n for n in nets if n.levels is not None]
    if per_node is None:
        if any(s.name == "hybrid" for s in strategies) or scale_nodes:
            raise UsageError("--sharding and --scale-nodes need the job's nodes: give --nodes and --gpus-per-node, "
                             "e.g. --nodes 2 --gpus-per-node 8")
        per_node = world
    if any(s.name == "hybrid" for s in strategies) and not two_level:
        text = ",".join(s.text for s in strategies)
        raise UsageError(f"--sharding {text} needs two networks, inside a node and between nodes: give both "
                         f"levels, e.g. {EXAMPLE}, or an `nccl --groups world,node,cross` record (--net and a "
                         f"one-level --nccl are the world's collective only)")
    for s in strategies:
        s.resolve(world, per_node)
    return ShardingPlan(tuple(strategies), per_node, tuple(scale_nodes or ()))
