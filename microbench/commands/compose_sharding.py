"""compose's two networks and sharding (issue 24): its flags and its tables, the strategy x
network what-if and the same at other node counts. A thin printer over compose/sharding/whatif.py."""

from __future__ import annotations

import argparse
from typing import Any

from tabulate import tabulate

from ..compose.sharding import whatif as sw
from ..compose.inputs import ComposeInputs
from ..compose.report import format_bytes, format_rate, format_time
from ..compose.sharding.inputs import ShardingPlan


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("two networks and sharding (a node's GPUs, and the nodes)")
    g.add_argument("--net-intra", action="append", default=[], metavar="[NAME=]BUSBW[@LATENCY]",
                   help="the bus bandwidth of a collective among one node's GPUs (NVLink), e.g. 360GB/s; with "
                        "--net-inter, full sharding across nodes is costed on both")
    g.add_argument("--net-inter", action="append", default=[], metavar="[NAME=]BW[@LATENCY]",
                   help="one node's bandwidth to the others, all its NICs together, e.g. eth=1.25GB/s (10 Gbit "
                        "Ethernet) or ib=400GB/s@10us (8 x 400G); repeatable: a what-if over the NICs")
    g.add_argument("--sharding", metavar="full|hybrid|hybrid:G", help="the what-if over strategies, comma-separated: "
                   "full (every rank shards), hybrid (shard inside a node, replicate across nodes: HSDP), hybrid:G "
                   "(shard over G ranks), e.g. full,hybrid")
    g.add_argument("--scale-nodes", metavar="N,N,...", help="the sharding what-if also at these node counts, from "
                   "the same curves (fitted latency and bandwidth per level), e.g. 2,8,64")


def print_sharding(given: ComposeInputs, plan: ShardingPlan) -> list[dict[str, Any]]:
    """Print the what-ifs; return the record's rows (op "sharding")."""
    model, train = given.model, given.train
    capacity = given.rate.gpu.usable_memory_bytes if given.rate.gpu else None
    rows = sw.whatif(model, train, given.networks, plan, capacity)
    nodes = max(1, train.ranks // plan.ranks_per_node)
    layout = (f"{train.ranks} ranks" if given.nodes is None and plan.ranks_per_node == train.ranks
              else f"{nodes} node{'s' if nodes > 1 else ''} x {plan.ranks_per_node} ranks")
    print(f"\n## what-if: sharding x network ({layout})")
    print(tabulate(sw.table(rows, format_time, format_bytes), headers=sw.HEADERS, tablefmt="simple",
                   disable_numparse=True))
    for net in given.networks:
        if net.levels is not None:
            lv = net.levels
            print(f"# {net.name}: intra {format_rate(lv.intra_gbps('all_gather'))} busbw, one node to the others "
                  f"{format_rate(lv.node_inter_gbps('all_gather'))} ({lv.source})")
    for line in sw.memory_notes(rows, format_bytes) + sw.notes(rows):
        print(f"# {line}")
    print("# hybrid: AllGather and ReduceScatter inside the shard group; each unit's gradient shard all-reduced "
          "across the replicas once per step behind the last micro-batch's backward (FSDP2 HSDP, "
          "set_requires_all_reduce(False) on the others); ring collectives, each bound by the slower level "
          "(compose/levels.py)")
    if train.grad_accum == 1 and any(r.strategy.startswith("hybrid") for r in rows):
        print("# with --grad-accum K, full sharding crosses nodes K times per step, hybrid's all-reduce still once")
    scaled = sw.scale(model, train, given.networks, plan, capacity)
    if scaled:
        print(f"\n## what-if at other node counts ({plan.ranks_per_node} ranks per node)")
        print(tabulate(sw.table(scaled, format_time, format_bytes, with_nodes=True),
                       headers=["nodes", "ranks"] + sw.HEADERS, tablefmt="simple", disable_numparse=True))
        print(f"# method: {sw.SCALE_METHOD}")
    return [r.as_dict() for r in rows] + [dict(r.as_dict(), scaled=True, method=sw.SCALE_METHOD) for r in scaled]
