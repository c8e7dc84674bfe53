"""Golden-input tests of two-level networks and full/hybrid sharding (issue 24): synthetic curves
with known latency and bandwidth, so every expected time is written out by hand."""

import dataclasses

import pytest

from microbench.compose import Curve, TrainSpec, memory_check, predict_step, synthetic_network
from microbench.compose.levels import described_levels, levels_from_record, two_level_network
from microbench.compose.model import CrudeModel, preset
from microbench.compose.sharding.predict import Strategy, parse_sharding, predict_sharding
from microbench.core.errors import UsageError
from microbench.core.units import bus_factor

GB = 1e9


def rows(op, group, ranks, busbw_gbps, latency_s=0.0, sizes=(1 << 20, 4 << 20, 16 << 20, 64 << 20)):
    factor = bus_factor(op, ranks)
    out = []
    for size in sizes:
        t = latency_s + size * factor / (busbw_gbps * GB)
        algbw = size / t / GB
        out.append({"op": op, "group": group, "size_bytes": size, "placement": "out", "ranks": ranks,
                    "time_us": {"p50": t * 1e6}, "algbw_gbps": algbw, "busbw_gbps": algbw * factor})
    return out


def grouped_record(nodes=2, per_node=4, world_gbps=2.0, node_gbps=100.0, cross_gbps=0.5):
    """A `nccl --groups world,node,cross` record: cross_gbps is what each cross group got while
    all per_node of them shared each node's NICs."""
    out = []
    for op in ("all_gather", "reduce_scatter"):
        out += rows(op, "world", nodes * per_node, world_gbps, 50e-6)
        out += rows(op, "node", per_node, node_gbps, 10e-6)
        out += rows(op, "cross", nodes, cross_gbps, 40e-6)
    return {"kind": "nccl", "status": "complete", "rows": out, "config": {"world": {"size": nodes * per_node}},
            "implementation": {"backend": "nccl", "device": "cuda"}}


def test_the_world_curve_of_a_grouped_record_leaves_the_node_and_cross_rows_out():
    # Before groups were read, every all_gather row went into one curve: a 100 GB/s node curve
    # and a 0.5 GB/s cross curve blended into a world curve that was neither.
    curve = Curve.from_record(grouped_record(), "all_gather")
    assert curve.ranks == 8
    assert curve.peak_busbw_gbps == pytest.approx(2.0, rel=1e-6)
    assert curve.latency_s == pytest.approx(50e-6, rel=1e-6)


def test_levels_from_a_grouped_record():
    levels = levels_from_record(grouped_record(), "lab", "n.json")
    assert levels.intra.all_gather.ranks == 4 and levels.inter.all_gather.ranks == 2
    assert levels.inter_groups == 4                      # the cross groups ran at once, one per rank of a node
    assert levels.node_inter_gbps("all_gather") == pytest.approx(4 * 0.5, rel=1e-6)
    assert levels.intra_gbps("reduce_scatter") == pytest.approx(100.0, rel=1e-6)
    assert levels_from_record({"rows": rows("all_gather", "world", 8, 1.0)}, "x", "x.json") is None
    # the probe's own count of cross groups that ran at once wins over the node's ranks
    record = grouped_record()
    for row in record["rows"]:
        if row["group"] == "cross":
            row["groups_at_once"] = 2
    assert levels_from_record(record, "lab", "n.json").node_inter_gbps("all_gather") == pytest.approx(2 * 0.5, rel=1e-6)


def test_a_collective_inside_a_node_is_the_intra_curve():
    levels = levels_from_record(grouped_record(), "lab", "n.json")
    t, how = levels.group_time_s("all_gather", 4 << 20, 4, nodes=1)
    assert t == pytest.approx(10e-6 + (4 << 20) * 3 / 4 / 100e9, rel=1e-6) and "intra" in how and "measured" in how


def test_cross_groups_as_measured_use_the_cross_curve_itself():
    levels = levels_from_record(grouped_record(), "lab", "n.json")
    t, how = levels.group_time_s("reduce_scatter", 16 << 20, 2, nodes=2, sharing=4)
    assert t == pytest.approx(40e-6 + (16 << 20) * 0.5 / 0.5e9, rel=1e-6) and "as measured" in how


def test_a_ring_across_nodes_is_bound_by_the_slower_level():
    levels = described_levels("x", 300.0, 5e-6, 2.0, 30e-6, "--net-intra 300GB/s --net-inter 2GB/s")
    # 16 ranks on 2 nodes: every ring link carries 15/16 S, the node's NICs carry it too.
    t, how = levels.group_time_s("all_gather", 1e9, 16, nodes=2, sharing=1)
    assert t == pytest.approx(30e-6 + 1e9 * 15 / 16 / 2e9) and "min(intra 300, node inter 2 GB/s) = 2 GB/s" in how
    # 8 groups sharing the NICs: each gets 1/8 of them.
    t, _ = levels.group_time_s("all_gather", 1e9, 2, nodes=2, sharing=8)
    assert t == pytest.approx(30e-6 + 1e9 * 0.5 / (2e9 / 8))
    # a fast inter level: NVLink bounds it
    fast = described_levels("x", 300.0, 0.0, 800.0, 0.0, "")
    assert fast.group_time_s("reduce_scatter", 1e9, 16, nodes=2)[0] == pytest.approx(1e9 * 15 / 16 / 300e9)


MODEL = CrudeModel("m", 16e9, 16)   # 1e9 params per block, no root


def train(ranks=16, **kw):
    return TrainSpec(ranks=ranks, micro_batch=1, seq_len=1024, flops_per_rank=100e12, **kw)


def test_full_sharding_on_two_levels_is_one_level_at_the_slower_rate():
    levels = described_levels("x", 360.0, 0.0, 1.25, 0.0, "")
    full = predict_sharding(MODEL, train(), levels, ranks_per_node=8, shard_ranks=16)
    one = predict_step(MODEL, train(), *(Curve.synthetic(op, 1.25, 0.0, "") for op in ("all_gather", "reduce_scatter")))
    assert full.strategy == "full" and full.replicas == 1 and full.allreduce_s == 0
    assert full.step.step_s == pytest.approx(one.step_s, rel=1e-9)
    assert full.step.reduce_scatter_s == pytest.approx(16 * 2e9 * 15 / 16 / 1.25e9)


def test_a_measured_world_curve_is_what_full_sharding_uses():
    record = grouped_record()
    world = synthetic_network("w", 2.0, 50e-6, "")
    levels = levels_from_record(record, "lab", "n.json")
    full = predict_sharding(MODEL, train(8), levels, ranks_per_node=4, shard_ranks=8, world_network=world)
    assert full.step.step_s == pytest.approx(predict_step(MODEL, train(8), world.all_gather, world.reduce_scatter).step_s)


def test_hybrid_gathers_inside_the_node_and_all_reduces_its_shard_across_nodes():
    levels = described_levels("x", 400.0, 0.0, 1.0, 0.0, "")
    hybrid = predict_sharding(MODEL, train(), levels, ranks_per_node=8, shard_ranks=8)
    assert (hybrid.strategy, hybrid.shard_ranks, hybrid.replicas) == ("hybrid:8", 8, 2)
    # ReduceScatter of each 2 GB block (bf16) among the node's 8 ranks over NVLink.
    assert hybrid.step.reduce_scatter_s == pytest.approx(16 * 2e9 * 7 / 8 / 400e9)
    # Each block's 2/8 GB gradient shard all-reduced over 2 nodes, 8 such groups on the node's
    # 1 GB/s: 2 x 1/2 x 0.25 GB / (1/8 GB/s) = 2 s per block, 32 s for the 16 blocks.
    assert hybrid.allreduce_s == pytest.approx(16 * 2.0)
    # Backward is ~0.2 s per block: the queue falls behind, and all but the first blocks' worth is exposed.
    assert hybrid.allreduce_s - 3.5 < hybrid.exposed_allreduce_s < hybrid.allreduce_s
    base = predict_sharding(MODEL, train(), described_levels("x", 400.0, 0.0, 1e9, 0.0, ""), ranks_per_node=8,
                            shard_ranks=8)
    assert hybrid.step.step_s == pytest.approx(base.step.step_s - base.exposed_allreduce_s + hybrid.exposed_allreduce_s)


def test_a_fast_inter_level_hides_all_but_the_last_units_all_reduce():
    levels = described_levels("x", 400.0, 0.0, 50.0, 0.0, "")
    hybrid = predict_sharding(MODEL, train(), levels, ranks_per_node=8, shard_ranks=8)
    per_block = 2 * 0.5 * 0.25e9 / (50e9 / 8)
    assert hybrid.allreduce_s == pytest.approx(16 * per_block)
    assert hybrid.exposed_allreduce_s == pytest.approx(per_block)   # block 0's, after backward ends


def test_hybrid_all_reduces_once_per_step_while_full_sharding_crosses_nodes_every_micro_batch():
    levels = described_levels("x", 400.0, 0.0, 1.0, 0.0, "")
    one, eight = train(), train(grad_accum=8)
    full1, full8 = (predict_sharding(MODEL, t, levels, ranks_per_node=8, shard_ranks=16) for t in (one, eight))
    hyb1, hyb8 = (predict_sharding(MODEL, t, levels, ranks_per_node=8, shard_ranks=8) for t in (one, eight))
    assert full8.step.step_s > 7.5 * full1.step.step_s
    assert hyb8.allreduce_s == hyb1.allreduce_s
    every = predict_sharding(MODEL, eight, levels, ranks_per_node=8, shard_ranks=8, allreduce_every_microbatch=True)
    assert every.allreduce_s == pytest.approx(8 * hyb1.allreduce_s)


def test_hybrid_keeps_world_over_g_times_the_sharded_state():
    levels = described_levels("x", 400.0, 0.0, 1.0, 0.0, "")
    model = preset("llama-3.1-8b")
    t = dataclasses.replace(train(), seq_len=4096)
    full = predict_sharding(model, t, levels, ranks_per_node=8, shard_ranks=16, capacity_bytes=72e9)
    hyb = predict_sharding(model, t, levels, ranks_per_node=8, shard_ranks=8, capacity_bytes=72e9)
    ddp = predict_sharding(model, t, levels, ranks_per_node=8, shard_ranks=1, capacity_bytes=72e9)
    assert hyb.memory.sharded_state_bytes == pytest.approx(2 * full.memory.sharded_state_bytes)
    assert ddp.memory.sharded_state_bytes == pytest.approx(16 * model.total_params * 16 / 16)
    assert (full.memory.fits, hyb.memory.fits, ddp.memory.fits) == (True, True, False)
    assert hyb.memory == memory_check(model, dataclasses.replace(t, ranks=8), 72e9)


def test_replicas_inside_a_node_share_the_nics_among_the_shard_groups():
    levels = described_levels("x", 400.0, 0.0, 1.0, 0.0, "")
    # G 4 on 2 x 8: replicas of 4 ranks (2 per node), 4 such rings crossing each node.
    hyb = predict_sharding(MODEL, train(), levels, ranks_per_node=8, shard_ranks=4)
    assert hyb.replicas == 4
    assert hyb.allreduce_s == pytest.approx(16 * 2 * 3 / 4 * 0.5e9 / (1e9 / 4))
    # G 16 on 4 x 8: shard groups of two nodes, replicas across the other pair, all on the NICs.
    wide = predict_sharding(MODEL, train(32), levels, ranks_per_node=8, shard_ranks=16)
    assert wide.replicas == 2 and wide.exposed_allreduce_s == pytest.approx(wide.allreduce_s)


def test_one_level_network_cannot_predict_hybrid():
    with pytest.raises(UsageError, match="needs the two networks.*--net-intra"):
        predict_sharding(MODEL, train(), None, ranks_per_node=8, shard_ranks=8)


def test_parse_sharding():
    assert parse_sharding("full,hybrid,hybrid:4") == [Strategy("full", None), Strategy("hybrid", None),
                                                       Strategy("hybrid", 4)]
    for bad in ("fsdp", "hybrid:0", "hybrid:x", "full:8", "full,full"):
        with pytest.raises(UsageError, match="--sharding"):
            parse_sharding(bad)


@pytest.mark.parametrize("g,message", [
    (3, r"--sharding hybrid:3: a shard group of 3 ranks does not divide the world of 16 ranks \(2 nodes x 8\)"),
    (32, r"--sharding hybrid:32: a shard group of 32 ranks is larger than the world of 16 ranks"),
])
def test_a_shard_group_that_does_not_fit_the_world_names_the_numbers(g, message):
    with pytest.raises(UsageError, match=message):
        Strategy("hybrid", g).resolve(16, 8)


def test_a_shard_group_straddling_nodes_is_refused():
    with pytest.raises(UsageError, match="12 ranks straddles nodes of 8"):
        Strategy("hybrid", 12).resolve(48, 8)
    assert Strategy("hybrid", None).resolve(16, 8) == 8 and Strategy("full", None).resolve(16, 8) == 16


def test_two_levels_seen_as_one_network():
    levels = described_levels("eth", 360.0, 0.0, 1.25, 0.0, "--net-intra 360GB/s --net-inter 1.25GB/s")
    net = two_level_network("eth", levels, 8)
    t, how = net.all_gather.time_s(1e9, 16)
    assert t == pytest.approx(1e9 * 15 / 16 / 1.25e9) and "two-level ring over 2 nodes x 8" in how
    assert net.describe()["levels"]["node_inter_gbps"]["all_gather"] == pytest.approx(1.25)


def test_the_whatif_rows_ratio_to_the_best_that_fits_and_scale_without_repeats():
    from microbench.compose.sharding.inputs import described, for_job, parse_level, plan
    from microbench.compose.sharding.whatif import scale, whatif

    nets = for_job(described([parse_level("360GB/s", "--net-intra")], [parse_level("eth=1.2GB/s", "--net-inter")]),
                   16, 2)
    model, t = preset("llama-3.1-8b"), dataclasses.replace(train(), seq_len=4096)
    p = plan(tuple(parse_sharding("full,hybrid,hybrid:1")), (1, 64), nets, 16, 2)
    rows = {r.strategy: r for r in whatif(model, t, nets, p, 72e9)}
    assert rows["hybrid:1"].result.memory.fits is False
    assert rows["hybrid:8"].ratio == 1.0                       # the best that fits
    assert rows["full"].ratio == pytest.approx(rows["full"].result.step.step_s / rows["hybrid:8"].result.step.step_s)
    scaled = scale(model, t, nets, p, 72e9)
    # one node: hybrid's shard group is the world, the full sharding row already there
    assert [(r.nodes, r.strategy) for r in scaled] == [(1, "full"), (1, "hybrid:1"), (64, "full"), (64, "hybrid:8"),
                                                       (64, "hybrid:1")]
    at64 = {r.strategy: r.result for r in scaled if r.nodes == 64}
    # 64 nodes: each replica group all-reduces its 1/8 over 64 nodes, 8 groups on the node's 1.2 GB/s
    shard_bytes = (model.block_params * 32 + model.root_params) * 2 / 8
    assert at64["hybrid:8"].allreduce_s == pytest.approx(2 * 63 / 64 * shard_bytes / (1.2e9 / 8), rel=1e-6)


def test_the_cross_groups_measured_all_reduce_is_what_hybrid_uses_when_they_are_as_measured():
    record = grouped_record(nodes=2, per_node=8, cross_gbps=0.5)
    record["rows"] += [dict(r, groups_at_once=8) for r in rows("all_reduce", "cross", 2, 0.1, 40e-6)]
    levels = levels_from_record(record, "lab", "n.json")
    t, how = levels.all_reduce_time_s(16 << 20, 2, 2, sharing=8)
    assert "all_reduce as measured: measured" in how
    assert t == pytest.approx(40e-6 + (16 << 20) * 1.0 / 0.1e9, rel=1e-6)   # the rows' own times (bus factor 1)
    # another sharing than measured: a ReduceScatter and an AllGather on the fits
    t, how = levels.all_reduce_time_s(16 << 20, 2, 2, sharing=4)
    assert how.startswith("as a reduce_scatter and an all_gather") and t == pytest.approx(
        2 * (40e-6 + (16 << 20) * 0.5 / (0.5e9 * 8 / 4)), rel=1e-6)
    hyb = predict_sharding(MODEL, train(), levels, ranks_per_node=8, shard_ranks=8)
    # each block's 2/8 GB shard: past the measured sizes, the all-reduce curve's own fit
    assert hyb.allreduce_s == pytest.approx(16 * (40e-6 + 2e9 / 8 * 1.0 / 0.1e9), rel=1e-6)
