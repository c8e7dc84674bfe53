"""compose/checkpoint/full.py on golden inputs: a full state dict save priced as gather + host copy +
one writer, a sharded one as bytes over the aggregate, and the CLI printing both per tier."""

from __future__ import annotations

import pytest

from microbench.compose.checkpoint import full as fs
from microbench.compose.curves import Curve
from microbench.compose.tiers import Tier, described
from microbench.core.errors import UsageError

GB = 1e9


def test_a_full_save_is_gather_then_host_copy_then_the_slower_of_serialization_and_the_stream():
    curve = Curve.synthetic("all_gather", 40.0, 0.0, "test")   # 40 GB/s busbw, no latency
    # 16 ranks: an AllGather of S bytes moves S x 15/16 at busbw; 10 pieces of 10 GB.
    gathered = fs.gather_s(100 * GB, 10 * GB, 16, curve)
    assert gathered == pytest.approx(10 * (10 * GB * 15 / 16) / (40 * GB))
    pred = fs.full_save("nvme", 100 * GB, gather_time_s=gathered, host_link_gbps=50.0, serialize_gbps=4.0,
                        stream_gbps=2.0, aggregate_gbps=10.0, nodes=2, aggregate_is_job=True)
    assert pred.offload_s == pytest.approx(2.0) and pred.write_s == pytest.approx(50.0)
    assert pred.save_s == pytest.approx(gathered + 2.0 + 50.0)
    assert pred.write_gbps == 2.0 and pred.bounded_by == "the tier's single stream"
    assert pred.host_bytes == 100 * GB and pred.host_fits is None


def test_a_single_stream_is_never_more_than_one_nodes_share_of_a_job_aggregate():
    args = dict(gather_time_s=0.0, host_link_gbps=None, serialize_gbps=100.0, aggregate_gbps=8.0, nodes=4)
    assert fs.full_save("t", 8 * GB, stream_gbps=5.0, aggregate_is_job=True, **args).write_gbps == 2.0
    # Unknown stream: one node's share, said so.
    unknown = fs.full_save("t", 8 * GB, stream_gbps=None, aggregate_is_job=True, **args)
    assert unknown.write_gbps == 2.0 and unknown.bounded_by == "one node's share of the tier"
    # A measured record is one host's own bandwidth: not divided by the job's nodes.
    assert fs.full_save("t", 8 * GB, stream_gbps=5.0, aggregate_is_job=False, **args).write_gbps == 5.0
    # Serialization slower than the stream bounds it; from a CPU there is no host copy.
    slow = fs.full_save("t", 8 * GB, stream_gbps=5.0, aggregate_is_job=False,
                        **{**args, "serialize_gbps": 1.0})
    assert slow.write_s == pytest.approx(8.0) and slow.offload_s is None
    assert slow.bounded_by == "one process's serialization"


def test_host_memory_for_the_whole_state_on_rank0s_node():
    args = dict(gather_time_s=0.0, host_link_gbps=None, serialize_gbps=2.0, stream_gbps=2.0, aggregate_gbps=10.0,
                nodes=1, aggregate_is_job=True)
    assert fs.full_save("t", 100 * GB, host_memory_bytes=120 * GB, **args).host_fits is True
    st = fs.full_save("t", 100 * GB, fmt="safetensors", host_memory_bytes=120 * GB, **args)
    assert st.host_bytes == 200 * GB and st.host_fits is False   # safetensors builds the file in memory
    lines = fs.notes([Tier("t", 1.0, None, "--tier", stream_gbps=2.0)], ["full"], "x", 120 * GB, [st])
    assert any(line.startswith("DOES NOT FIT: a full safetensors save on t needs 200.0 GB") for line in lines)


def test_predict_saves_gives_both_per_tier_and_the_sharded_one_is_bytes_over_the_aggregate():
    curve = Curve.synthetic("all_gather", 40.0, 0.0, "test")
    tiers = [Tier("nvme", 10.0, None, "--tier", stream_gbps=2.0, rated_only=False),
             Tier("shared", 1.6, None, "--tier", stream_gbps=None, rated_only=True)]
    preds = fs.predict_saves(tiers, ["full", "sharded"], None, 146 * GB, unit_bytes=4 * GB, ranks=16, nodes=2,
                             curve=curve, host_link_gbps=64.0, serialize_gbps=2.0)
    assert [(p.tier, p.state_dict, p.save_format) for p in preds] == [
        ("nvme", "full", "torch"), ("nvme", "sharded", "dcp"), ("shared", "full", "torch"), ("shared", "sharded", "dcp")]
    assert preds[1].save_s == pytest.approx(14.6) and preds[3].save_s == pytest.approx(146 / 1.6)
    assert preds[2].write_gbps == pytest.approx(0.8)   # half of 1.6 GB/s over 2 nodes
    assert preds[0].save_s > preds[1].save_s
    lines = fs.notes(tiers, ["full", "sharded"], "assumed", None, preds)
    assert any("shared: described only by its rated aggregate bandwidth; a DCP save from GPUs usually reaches far "
               "less" in line and "microbench checkpoint" in line for line in lines)
    assert any(line.startswith("shared: single-stream write not given") for line in lines)
    assert not any(line.startswith("nvme:") for line in lines)


@pytest.mark.parametrize("call, fragment", [
    (lambda: fs.parse_state_dicts("full,consolidated"), "invalid --state-dict 'full,consolidated'"),
    (lambda: fs.parse_state_dicts(""), "invalid --state-dict ''"),
    (lambda: fs.save_format("full", "pickle"), "invalid --save-format 'pickle'"),
    (lambda: fs.save_format("full", "dcp"), "invalid --save-format 'dcp' with --state-dict full"),
    (lambda: described.split_stream("nvme=10:10,stream=2,stream=3"), "one stream=GB/S at most"),
    (lambda: fs.serialize_from_record({"kind": "checkpoint", "config": {"probe": {"state_dict": "sharded"}}}, "r.json"),
     "of a sharded save"),
])
def test_bad_input(call, fragment):
    with pytest.raises(UsageError, match=None) as info:
        call()
    assert fragment in str(info.value)


def test_serialization_rate_from_a_full_checkpoint_record():
    record = {"kind": "checkpoint", "config": {"probe": {"state_dict": "full", "save_format": "torch"}},
              "rows": [{"op": "save", "size_bytes": 2 * GB, "serialize_write_time_us": 1e6}]}
    gbps, source = fs.serialize_from_record(record, "r.json")
    assert gbps == pytest.approx(2.0) and source.startswith("measured: r.json")
    from microbench.compose.tiers.described import split_stream

    assert split_stream("nvme=10:10,stream=2") == ("nvme=10:10", "2")
    assert split_stream("nvme=10:10") == ("nvme=10:10", None)
    assert split_stream("m=2:4,cached,stream=0.5,drain=1") == ("m=2:4,cached,drain=1", "0.5")


def test_the_acceptance_command_prints_both_saves_per_tier(cli):
    proc = cli("compose", "--model", "gemma-3-12b", "--nodes", "2", "--gpus-per-node", "8", "--gpu", "h100",
                   "--net", "ib=40GB/s", "--tier", "nvme=10:10,stream=2", "--tier", "shared=1.6:6.4",
                   "--state-dict", "full,sharded", timeout=120)
    assert proc.returncode == 0, proc.stderr
    table = proc.stdout.split("## saves per tier", 1)[1]
    rows = [line.split()[:3] for line in table.splitlines() if line.startswith(("nvme ", "shared "))]
    assert rows == [["nvme", "full", "torch"], ["nvme", "sharded", "dcp"], ["shared", "full", "torch"],
                    ["shared", "sharded", "dcp"]]
    assert "shared: described only by its rated aggregate bandwidth" in proc.stdout


@pytest.mark.parametrize("args, fragment", [
    (("--state-dict", "fool"), "invalid --state-dict 'fool'"),
    (("--state-dict", "full", "--save-format", "zip"), "invalid --save-format 'zip'"),
    (("--tier", "nvme=10:10,stream=x"), "invalid --tier 'nvme=10:10,stream=x'"),
])
def test_cli_bad_input_exits_2_with_one_line(cli, args, fragment):
    proc = cli("compose", "--gpu", "h100", "--nodes", "1", "--net", "ib=40GB/s", "--tier", "a=1:1", *args,
                   timeout=60)
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and fragment in lines[0]
