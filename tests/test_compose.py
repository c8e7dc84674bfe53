"""Golden-input tests of the composer: synthetic curves with a known latency and bandwidth."""

import math

import pytest

from microbench.compose import (CheckpointSpec, Curve, ModelSpec, TrainSpec, checkpoint_bytes, predict_step,
                                predict_tier, required_write_gbps)
from microbench.errors import UsageError

LAT_S, BUSBW = 100e-6, 1.0  # 100 us, 1 GB/s


def record(op, ranks=2, sizes=(1 << 20, 4 << 20, 16 << 20, 64 << 20)):
    factor = (ranks - 1) / ranks
    rows = []
    for size in sizes:
        t = LAT_S + size * factor / (BUSBW * 1e9)
        algbw = size / t / 1e9
        rows.append({"op": op, "size_bytes": size, "placement": "out", "ranks": ranks,
                     "time_us": {"p50": t * 1e6}, "algbw_gbps": algbw, "busbw_gbps": algbw * factor})
    return {"rows": rows, "config": {"world": {"size": ranks}}}


def test_curve_recovers_the_model_it_was_built_from():
    curve = Curve.from_record(record("all_gather"), "all_gather")
    assert curve.latency_s == pytest.approx(LAT_S, rel=1e-6)
    assert curve.peak_busbw_gbps == pytest.approx(BUSBW, rel=1e-6)
    t, how = curve.time_s(4 << 20)
    assert how == "measured" and t == pytest.approx(LAT_S + (4 << 20) * 0.5 / 1e9)
    t, how = curve.time_s(1 << 30)
    assert how.startswith("extrapolated") and t == pytest.approx(LAT_S + (1 << 30) * 0.5 / 1e9, rel=1e-6)
    t, how = curve.time_s(8 << 20)
    assert how == "interpolated"
    assert curve.time_s(4 << 20)[0] < t < curve.time_s(16 << 20)[0]


def test_curve_rescales_to_another_world_size():
    curve = Curve.from_record(record("reduce_scatter"), "reduce_scatter")
    t, how = curve.time_s(64 << 20, ranks=8)
    assert "rescaled from 2 to 8" in how
    assert t == pytest.approx(LAT_S + (64 << 20) * 7 / 8 / 1e9, rel=1e-6)


def test_missing_op_names_what_the_record_has():
    with pytest.raises(UsageError, match="no 'all_gather' rows .*reduce_scatter"):
        Curve.from_record(record("reduce_scatter"), "all_gather")


@pytest.mark.parametrize("time_us", [None, {}, {"p50": 0}, {"p50": "12"}, {"p50": math.nan}], ids=repr)
def test_rows_of_the_op_without_a_time_are_not_called_missing(time_us):
    # It once said "has no 'all_gather' rows (it has: all_gather, ...)": the rows were there,
    # without a usable time.
    bad = record("all_gather")
    for row in bad["rows"]:
        row["time_us"] = time_us
    with pytest.raises(UsageError) as info:
        Curve.from_record(bad, "all_gather", "n.json")
    text = str(info.value)
    assert "has 4 'all_gather' row(s) but none with a measured time" in text and "has no" not in text


def test_compute_bound_step_hides_communication():
    ag = Curve.from_record(record("all_gather"), "all_gather")
    rs = Curve.from_record(record("reduce_scatter"), "reduce_scatter")
    model = ModelSpec("m", params=1e8, layers=10)
    # 1e7 params per unit; 2 bytes -> 20 MB gather, 4 bytes -> 40 MB reduce-scatter.
    slow_compute = TrainSpec(ranks=2, tokens_per_rank=4096, flops_per_rank=1e12)
    p = predict_step(model, slow_compute, ag, rs)
    c_f = 2 * 1e7 * 4096 / 1e12
    c_b = 4 * 1e7 * 4096 / 1e12
    t_ag, t_rs = ag.time_s(2e7)[0], rs.time_s(4e7)[0]
    assert t_ag == pytest.approx(LAT_S + 2e7 * 0.5 / 1e9, rel=5e-3)  # log-log interpolation
    assert c_b > t_ag + t_rs  # compute-bound by construction
    assert p.compute_s == pytest.approx(10 * (c_f + c_b))
    assert p.step_s == pytest.approx(t_ag + 10 * c_f + t_ag + 10 * c_b + t_rs)
    assert p.full_overlap_s <= p.step_s <= p.no_overlap_s
    assert p.exposed_comm_s == pytest.approx(2 * t_ag + t_rs)


def test_network_bound_step_is_the_communication():
    ag = Curve.from_record(record("all_gather"), "all_gather")
    rs = Curve.from_record(record("reduce_scatter"), "reduce_scatter")
    model = ModelSpec("m", params=1e8, layers=10)
    fast_compute = TrainSpec(ranks=2, tokens_per_rank=128, flops_per_rank=1e15)
    p = predict_step(model, fast_compute, ag, rs)
    t_ag, t_rs = ag.time_s(2e7)[0], rs.time_s(4e7)[0]
    c_f, c_b = 2 * 1e7 * 128 / 1e15, 4 * 1e7 * 128 / 1e15
    assert p.step_s == pytest.approx(t_ag + 9 * t_ag + c_f + t_ag + 9 * (t_ag + t_rs) + c_b + t_rs)
    assert p.step_s / p.compute_s > 100


def test_checkpoint_bytes_and_tiers():
    spec = CheckpointSpec(params=1e9)
    assert checkpoint_bytes(spec) == 12e9  # fp32 master + two fp32 Adam moments
    tier = predict_tier("nvme", 12e9, write_gbps=3.0, read_gbps=6.0, fixed_s=1.0, staging_gbps=12.0, mtbf_s=86400)
    assert tier.save_s == pytest.approx(5.0)
    assert tier.load_s == pytest.approx(3.0)
    assert tier.async_blocked_s == pytest.approx(1.0)
    assert tier.young_daly_interval_s == pytest.approx(math.sqrt(2 * 5.0 * 86400))
    assert required_write_gbps(12e9, interval_s=600, overhead_fraction=0.02) == pytest.approx(1.0)


@pytest.mark.parametrize("call", [
    lambda: predict_tier("s3", 1e9, write_gbps=0),
    lambda: required_write_gbps(1e9, 0, 0.1),
    lambda: checkpoint_bytes(CheckpointSpec(1e9, optimizer="adam9")),
])
def test_bad_inputs_are_usage_errors(call):
    with pytest.raises(UsageError):
        call()


def test_compose_cli_prints_step_and_tiers(run_cli, tmp_path):
    import json

    from microbench.results import RecordWriter, new_record

    rec = new_record("nccl", {}, {}, {})
    rec["rows"] = record("all_gather")["rows"] + record("reduce_scatter")["rows"]
    path = RecordWriter(rec, tmp_path / "n.json").finish("complete")
    done = run_cli("compose", "--nccl", str(path), "--model", "tiny-100m", "--tier", "nvme=6:12")
    assert done.returncode == 0, done.stderr
    assert "step (overlapped)" in done.stdout and "nvme" in done.stdout
    bad = run_cli("compose", "--nccl", str(path), "--tier", "nvme")
    assert bad.returncode == 2
    assert bad.stderr.strip() == "microbench: invalid --tier 'nvme': expected NAME=WRITE_GBPS[:READ_GBPS], e.g. nvme=6:12"
    missing = run_cli("compose", "--nccl", str(tmp_path / "none.json"))
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    assert json.loads(path.read_text())["status"] == "complete"


def test_tiers_from_storage_records_skip_memory_served_rows():
    from microbench.compose.tiers import tier_bandwidths

    posix = {"kind": "storage_posix", "rows": [
        {"op": "write", "write_gbps": 1.5}, {"op": "write", "write_gbps": 9.0, "served_from_memory": True},
        {"op": "read", "read_gbps": 3.0}]}
    assert tier_bandwidths(posix) == (1.5, 3.0)
    s3 = {"kind": "storage_s3", "rows": [{"op": "put", "throughput_gbps": 0.5}, {"op": "get", "throughput_gbps": 0.9}]}
    assert tier_bandwidths(s3) == (0.5, 0.9)
    with pytest.raises(UsageError, match="no write/put/save rows"):
        tier_bandwidths({"kind": "storage_posix", "rows": [{"op": "read", "read_gbps": 3.0}]}, "r.json")
