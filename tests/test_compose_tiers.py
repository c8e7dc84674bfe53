"""compose/tiers: a Tier, described by --tier or measured by a storage record; what the record
keeps of it is what it kept as a dict."""

from __future__ import annotations

import pytest

from microbench.compose.tiers import Tier, described
from microbench.compose.tiers.records import measured
from microbench.core.errors import UsageError


def test_a_described_tier_and_its_record_form():
    (t,) = described.resolve([described.parse("nvme=6:12,stream=2,ephemeral")])
    assert (t.name, t.write_gbps, t.read_gbps, t.stream_gbps, t.durable, t.described) == ("nvme", 6, 12, 2, False, True)
    assert not t.rated_only and t.mount is None and not t.cached and t.medium == ""
    assert t.as_dict() == {"tier": "nvme", "write_gbps": 6.0, "read_gbps": 12.0, "source": "--tier nvme=6:12,stream=2,ephemeral",
                           "stream_gbps": 2.0, "rated_only": False, "aggregate_is_job": True, "durable": False}


def test_rates_take_units_and_a_mount_is_a_mount():
    a, m = described.resolve([described.parse("a=10gbit:2GB/s"), described.parse("m=1:1,direct")])
    assert (a.write_gbps, a.read_gbps, a.rated_only) == (1.25, 2.0, True)
    assert m.medium == "mount" and m.mount is not None and not m.cached and "mount" in m.as_dict()


@pytest.mark.parametrize("text, message", [
    ("nvme", "expected NAME=WRITE_GBPS[:READ_GBPS]"),
    ("nvme=0", "the write bandwidth '0' must be a positive finite number"),
    ("nvme=1:x", "the read bandwidth 'x'"),
    ("nvme=1,stream=1,stream=2", "one stream=GB/S at most"),
    ("nvme=1,ephemeral,durable", "give ephemeral or durable once"),
])
def test_bad_tier_text_is_refused_when_parsed(text, message):
    with pytest.raises(UsageError, match=message.replace("[", r"\[")):
        described.parse(text)


def test_measured_tiers_say_what_they_are():
    posix = {"kind": "storage_posix", "status": "complete", "rows": [
        {"op": "write", "write_gbps": 1.5}, {"op": "read", "read_gbps": 3.0},
        {"op": "write", "write_gbps": 0.4, "stream": "single"}]}
    t = measured(posix, "", "p.json")
    assert (t.name, t.write_gbps, t.read_gbps, t.stream_gbps, t.medium) == ("storage_posix", 1.5, 3.0, 0.4, "directory")
    assert not t.described and not t.aggregate_is_job and "durable" not in t.as_dict()
    s3 = {"kind": "storage_s3", "status": "complete", "implementation": {"endpoint": "http://x"},
          "rows": [{"op": "put", "throughput_gbps": 0.5}]}
    assert measured(s3, "obj", "s.json").medium == "s3"
    mount = {"kind": "storage_mount", "status": "complete", "config": {"write_back_s": 1.0}, "rows": [
        {"op": "write", "mode": "cached", "size_bytes": 10**9, "blocked_time_us": 0.5e6, "durable_time_us": 3.5e6,
         "write_gbps": 2.0}]}
    m = measured(mount, "mm", "m.json")
    assert m.medium == "mount" and m.cached and m.mount.drain_gbps == pytest.approx(0.5)
    with pytest.raises(UsageError, match="is a 'partial' record"):
        measured(dict(posix, status="partial"), "", "p.json")
    assert isinstance(t, Tier)
