"""`verify fsdp --sharding hybrid`, rank side: HSDP on a 2-D mesh, its probes and its prediction.

HSDP is `fully_shard(module, mesh=init_device_mesh(device, (replicas, shard),
mesh_dim_names=("replicate", "shard")))`: parameters sharded over the ranks of a node (the mesh's
"shard" dimension, ranks_per_node of them), replicated across nodes. Per unit, FSDP2 gathers
within the node in forward and backward, reduce-scatters the gradients within the node, then
all-reduces the gradient shard over the replicas, one rank per node
(torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py: foreach_reduce, `dist.all_reduce(...,
group=all_reduce_group)`), every node's and every replica group's collectives at once.

The inputs are measured as those run: the collective probe's `node` groups (every node at once)
at the units' sizes, and its `cross` groups (all at once, sharing each host's link) with the
all-reduce at the gradient shards' sizes. The composer's hybrid step (compose/sharding/predict.py,
predict_sharding) takes the cross groups' measured all-reduce (Levels.inter_all_reduce), so the
time it adds is the all-reduce FSDP2 really issues, not a ReduceScatter plus an AllGather.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

from ...compose.curves import Curve, Network
from ...compose.fsdp import schedule
from ...compose.levels import Levels
from ...compose.sharding.predict import predict_sharding
from ...core.units import element_size
from ...probes import nccl as coll
from ...world import collectives
from ...world.dist import World
from ...world.topology import Topology, topology
from .. import model as fm

SHARDINGS = ("full", "hybrid")


@dataclass(frozen=True)
class Layout:
    """How the step's model is sharded: full (the world, a 1-D mesh) or hybrid (2-D)."""

    sharding: str
    topo: Topology | None = None

    @property
    def hybrid(self) -> bool:
        return self.sharding == "hybrid"


def layout_for(sharding: str | None, world_size: int) -> Layout:
    if sharding != "hybrid":
        return Layout("full")
    return Layout("hybrid", topology(world_size))


def mesh(layout: Layout, device: Any) -> Any:
    """The (replicate, shard) device mesh of hybrid sharding."""
    from torch.distributed.device_mesh import init_device_mesh

    topo = layout.topo
    assert topo is not None
    return init_device_mesh(getattr(device, "type", str(device)), (topo.nodes, topo.ranks_per_node),
                            mesh_dim_names=("replicate", "shard"))


KEEP = ("op", "group", "size_bytes", "dtype", "ranks", "busbw_gbps", "time_us")


def collective_cases(world: World, precision: fm.Precision, device: str, backend: str,
                     sizes: dict[str, int]) -> tuple[list[tuple[Any, Any]], dict[str, Any]]:
    """Within each node: AllGather and ReduceScatter at the unit sizes (`sizes`, steps.unit_sizes);
    across nodes: the all-reduce at the gradient shards' sizes (a unit's reduced bytes / shard).
    The probes (their groups made once) and their cases, to measure as often as needed."""
    topo = topology(world.size)
    g = topo.ranks_per_node
    cases = []
    plan = (("all_gather", precision.param_dtype, "node", sorted({sizes["block_ag"], sizes["root_ag"]})),
            ("reduce_scatter", precision.reduce_dtype, "node", sorted({sizes["block_rs"], sizes["root_rs"]})),
            ("all_reduce", precision.reduce_dtype, "cross", sorted({max(4, sizes["block_rs"] // g),
                                                                    max(4, sizes["root_rs"] // g)})))
    for op, dtype, group, op_sizes in plan:
        config = coll.Config(sizes=op_sizes, ops=[op], dtype=dtype, backend=backend, device=device, groups=[group])
        probe = coll.CollectiveProbe(config, world)
        placement = "in" if op == "all_reduce" else "out"
        cases += [(probe, case) for case in probe.cases() if case.param("placement") == placement]
    return cases, {"topology": topo.to_dict(),
                   "probe": "collectives within each node at the unit sizes and the all-reduce across nodes at the "
                            "gradient shards' sizes, every group at once"}


def levels(collectives: dict[str, Any], backend: str, device: str) -> Levels:
    """The two networks as the composer takes them, from this run's group rows."""
    rows = collectives["rows"]
    node = {"rows": [dict(r, group="world") for r in rows if r["group"] == "node"]}
    intra = Network("intra (node groups)", Curve.from_record(node, "all_gather", "measured in this run"),
                    Curve.from_record(node, "reduce_scatter", "measured in this run"), "measured in this run",
                    backend, device)
    cross = {"rows": [dict(r, group="world") for r in rows if r["group"] == "cross"]}
    # The inter level's AllGather and ReduceScatter, which this layout never runs across nodes,
    # stand in as the all-reduce's halves (what a ring all-reduce is made of).
    halves = {"rows": [dict(r, group="world", time_us={"p50": r["time_us"]["p50"] / 2}, op=op,
                            busbw_gbps=r["busbw_gbps"])
                       for r in rows if r["group"] == "cross" for op in ("all_gather", "reduce_scatter")]}
    inter = Network("inter (cross groups)", Curve.from_record(halves, "all_gather", "measured in this run"),
                    Curve.from_record(halves, "reduce_scatter", "measured in this run"), "measured in this run",
                    backend, device)
    per_node = collectives["topology"]["ranks_per_node"]
    return Levels(intra, inter, per_node, "node and cross groups measured in this run",
                  Curve.from_record(cross, "all_reduce", "measured in this run"))


def predict(shape: Any, train: Any, collectives: dict[str, Any], backend: str, device: str) -> dict[str, Any]:
    """The hybrid step (compose/sharding.predict_sharding) in predict()'s dict form."""
    per_node = collectives["topology"]["ranks_per_node"]
    out = predict_sharding(shape, train, levels(collectives, backend, device), ranks_per_node=per_node,
                           shard_ranks=per_node).as_dict()
    out["notes"] = list(out["notes"])
    return out


def comm_plan(world: World, shape: Any, precision: fm.Precision, device: Any, sizes: dict[str, int],
              topo: Topology) -> Callable[[], None]:
    """The hybrid step's collectives back to back: root and blocks gathered in the node for
    forward, blocks again for backward with each unit's ReduceScatter in the node and its
    gradient shard's all-reduce across nodes."""
    import torch
    import torch.distributed as dist

    node, _ = dist.new_subgroups_by_enumeration(topo.node_groups())
    cross, _ = dist.new_subgroups_by_enumeration(topo.cross_groups())
    g = topo.ranks_per_node
    pd, rd = getattr(torch, precision.param_dtype), getattr(torch, precision.reduce_dtype)
    rbytes = element_size(precision.reduce_dtype)

    def bufs(nbytes: int, dtype: Any, elem: int) -> tuple[Any, Any]:
        count = max(g, nbytes // elem // g * g)
        return torch.zeros(count, dtype=dtype, device=device), torch.zeros(count // g, dtype=dtype, device=device)

    buffers = {(unit, "all_gather"): bufs(sizes[f"{unit}_ag"], pd, precision.bytes) for unit in ("block", "root")}
    buffers.update({(unit, "reduce_scatter"): bufs(sizes[f"{unit}_rs"], rd, rbytes) for unit in ("block", "root")})
    # The replicas all-reduce the shard their ReduceScatter left.
    buffers.update({(unit, "all_reduce"): buffers[(unit, "reduce_scatter")] for unit in ("block", "root")})
    plan = [(c.op, buffers[(c.unit, c.op)]) for c in schedule(shape.layers, replicas=True)]
    all_gather, reduce_scatter = collectives.all_gather(dist), collectives.reduce_scatter(dist)

    def once() -> None:
        for what, (full, shard) in plan:
            if what == "all_gather":
                all_gather(full, shard, group=node)
            elif what == "reduce_scatter":
                reduce_scatter(shard, full, group=node)
            else:
                dist.all_reduce(shard, group=cross)

    return once


def timed_sampler(world: World, device: Any, run: Callable[[], None], sync: Callable[[Any], None],
                  slowest: Callable[[Any, float], float]) -> Callable[[], float]:
    def once() -> float:
        world.barrier()
        start = time.perf_counter()
        run()
        sync(device)
        return slowest(world, time.perf_counter() - start)

    return once
