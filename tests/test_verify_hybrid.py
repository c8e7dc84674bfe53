"""verify fsdp --sharding full,hybrid (issue 24): HSDP's prediction from the group probes, the
verdict on an HSDP checkpoint's stored copies, bad input, and the mechanism on a real lab of 2
hosts x 2 ranks (not this machine's speed: tolerances wide open there)."""

from __future__ import annotations

import json

import pytest

from conftest import one_error_line
from microbench.compose.fsdp import TrainSpec
from microbench.core.errors import UsageError
from microbench.verify.fsdp import hybrid
from microbench.verify import model as fm
from microbench.verify.fsdp.plan import check_hybrid, shardings
from microbench.verify.fsdp.report import step_table, verdict


def _rows(op, group, ranks, points):
    return [{"op": op, "group": group, "size_bytes": s, "dtype": "float32", "ranks": ranks, "busbw_gbps": s / t / 1e9,
             "time_us": {"p50": t * 1e6}} for s, t in points]


def test_the_hybrid_step_adds_the_measured_all_reduce_of_every_units_gradient_shard():
    shape = fm.PRESETS["tiny"]
    blk, root = shape.block_params * 4, shape.root_params * 4
    node = (_rows("all_gather", "node", 2, [(blk, 1e-3), (root, 2e-3)])
            + _rows("reduce_scatter", "node", 2, [(blk, 1e-3), (root, 2e-3)]))
    cross = _rows("all_reduce", "cross", 2, [(blk // 2, 5e-3), (root // 2, 9e-3)])
    collectives = {"rows": node + cross, "topology": {"nodes": 2, "ranks_per_node": 2, "from": "LOCAL_WORLD_SIZE"}}
    train = TrainSpec(ranks=4, micro_batch=1, seq_len=32, flops_per_rank=1e12, param_dtype="float32",
                      reduce_dtype="float32", overlap=0.0, memory_gbps=10.0)
    out = hybrid.predict(shape, train, collectives, "gloo", "cpu")
    # FSDP2 all-reduces each unit's gradient shard once across the replicas: what the probe
    # measured for that size, the composer's ReduceScatter + AllGather halves adding back to it.
    assert out["allreduce_s"] == pytest.approx(shape.layers * 5e-3 + 9e-3)
    assert out["shard_ranks"] == 2 and out["replicas"] == 2 and out["strategy"] == "hybrid:2"
    # Overlap 0: nothing hidden, the all-reduce is all on top of the shard group's step.
    assert out["step_s"] == pytest.approx(out["no_overlap_s"])


def test_sharding_flag_and_hybrid_needs_nodes_and_ranks_per_node():
    assert shardings("full,hybrid") == ["full", "hybrid"] and shardings(None) == ["full"]
    with pytest.raises(UsageError, match="invalid --sharding 'hybrid:3'"):
        shardings("hybrid:3")
    check_hybrid(["full", "hybrid"], 2, 2)
    with pytest.raises(UsageError, match=r"--sharding hybrid with 1 node\(s\) x 2 rank\(s\)"):
        check_hybrid(["hybrid"], 1, 2)
    check_hybrid(["full"], 1, 2)


def test_an_hsdp_checkpoint_stored_once_per_replica_group_fails_the_verdict():
    def row(written):
        part = {"error_pct": 1.0}
        return {"kind": "checkpoint", "target": "directory", "sharding": "hybrid", "replicas": 2, "bytes": 1000,
                "written_bytes": written, "save": part, "load": part}

    assert verdict([row(1004)], 10, 15)["pass"]
    failed = verdict([row(2000)], 10, 15)
    assert failed["outside"] == ["checkpoint save to directory hybrid: the 2 replicas' shards stored 2.00 times, not once"]


def test_step_rows_name_their_sharding_old_rows_are_full():
    parts = {"compute": {"error_pct": 0}, "collectives": {"error_pct": 0}, "overlap": {"implied_by_step": None}}
    rows = [{"profile": "1gbit", "model": "tiny", "tokens": 32, "predicted_s": 1, "measured_s": 1, "spread_pct": 0,
             "error_pct": 0, "parts": parts, **extra} for extra in ({}, {"sharding": "hybrid"})]
    lines = step_table(rows, 10).splitlines()[2:]
    assert lines[0].startswith("1gbit ") and lines[1].startswith("1gbit hybrid")


def test_hybrid_without_a_lab_of_several_ranks_per_host_exit_2(cli):
    done = cli("verify", "fsdp", "--sharding", "hybrid", "--model", "tiny", "--nproc", "2")
    assert done.returncode == 2
    assert "1 node(s) x 2 rank(s)" in one_error_line(done.stderr)


@pytest.mark.slow
@pytest.mark.root
@pytest.mark.xdist_group("hsdp-lab")  # the mechanism (tolerance 1000): beside other tests
def test_verify_full_and_hybrid_on_a_lab_of_two_hosts_by_two_ranks(run_cli, lab_name, tmp_path):
    """The mechanism: both shardings' steps predicted and measured on 4 ranks, HSDP's inputs from
    the node and cross groups, its DCP checkpoint stored once and loaded back equal."""
    from microbench.core.units import parse_link_rate
    from microbench.lab import namespaces as labmod

    labmod.up(lab_name, 2, parse_link_rate("1gbit"), ranks_per_host=2)
    out = tmp_path / "v.json"
    done = run_cli("verify", "fsdp", "--lab", lab_name, "--sharding", "full,hybrid", "--model", "tiny", "--tokens",
                   "32", "--steps", "2", "--warmup", "1", "--checkpoint", "--ckpt-reps", "1", "--cal-reps", "3", "--tolerance", "1000",
                   "--ckpt-tolerance", "1000", "--json", str(out), timeout=900)
    assert done.returncode in (0, 3), done.stderr   # 3: a busy machine left a row INCONCLUSIVE
    record = json.loads(out.read_text())
    steps = [r for r in record["rows"] if r["kind"] == "step"]
    assert sorted(r["sharding"] for r in steps) == ["full", "hybrid"] and {r["ranks"] for r in steps} == {4}
    hsdp = next(r for r in steps if r["sharding"] == "hybrid")
    assert hsdp["topology"]["nodes"] == 2 and hsdp["predicted"]["replicas"] == 2
    groups = {(r["op"], r["group"]) for r in hsdp["inputs"]["collectives"]["rows"]}
    assert groups == {("all_gather", "node"), ("reduce_scatter", "node"), ("all_reduce", "cross")}
    profile = steps[0]["profile"]   # one profile: the lab as it is
    assert set(record["summary"]["calibration_by_profile"]) == {profile, f"{profile} hybrid"}
    # --cal-reps: each calibration number read from that many steps (pairs), and the record says so.
    assert record["config"]["cal_reps"] == 3
    for cal in record["summary"]["calibration_by_profile"].values():
        d = cal["details"]
        assert len(d["overlap"]["steps_s"]) == len(d["unit_overhead"]["fsdp_steps_s"]) == len(d["compute_efficiency"]["ratios"]) == 3
    ckpts = [r for r in record["rows"] if r["kind"] == "checkpoint"]
    hybrid_ckpts = [r for r in ckpts if r["sharding"] == "hybrid"]
    assert {r["target"] for r in hybrid_ckpts} == {"directory", "s3"}
    for row in hybrid_ckpts:
        assert row["wrong_loads"] == 0 and row["replicas"] == 2
        assert row["written_bytes"] <= 1.1 * row["bytes"]   # the replicas' shards stored once
