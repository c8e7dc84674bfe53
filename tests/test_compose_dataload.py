"""compose/dataload.py on golden inputs: the loader's time per step, whether prefetching hides
it, the exposed stall, and the model load time per tier."""

from __future__ import annotations

import pytest

from microbench.compose import dataload as dl
from microbench.compose.tiers import Tier
from microbench.core.errors import UsageError


def _record(rows, kind="dataload"):
    return {"kind": kind, "rows": rows, "implementation": {"filesystem": "ext4"}}


def test_the_best_worker_count_per_rank_and_its_stall():
    rec = _record([{"op": "shards", "workers": 0, "ranks": 2, "samples_per_s": 400.0, "read_gbps": 0.4},
                   {"op": "shards", "workers": 4, "ranks": 2, "samples_per_s": 1000.0, "read_gbps": 1.0}])
    rate = dl.rate_from_record(rec, "r.json", None, "nfs")
    assert rate.samples_per_s_per_rank == 500.0 and rate.prefetch
    hidden = dl.data_stall(rate, 100, 0.5)           # 0.2 s of loading inside a 0.5 s step
    assert hidden.loader_s == pytest.approx(0.2) and hidden.hidden and hidden.stall_s == 0
    exposed = dl.data_stall(rate, 400, 0.5)          # 0.8 s: 0.3 s exposed
    assert not exposed.hidden and exposed.stall_s == pytest.approx(0.3) and exposed.step_with_stall_s == pytest.approx(0.8)
    assert exposed.bottleneck


def test_larger_samples_are_held_to_the_bytes_rate_and_workers_0_is_never_hidden():
    rec = _record([{"op": "files", "workers": 0, "ranks": 1, "samples_per_s": 1000.0, "read_gbps": 0.016}])
    rate = dl.rate_from_record(rec, "r.json", 160000, "")
    assert rate.samples_per_s_per_rank == pytest.approx(100.0) and not rate.prefetch
    stall = dl.data_stall(rate, 10, 1.0)
    assert stall.stall_s == pytest.approx(0.1) and not stall.hidden


def test_model_load_at_start_and_each_restart():
    rec = _record([{"op": "raw_read", "raw_read_gbps": 3.0, "ranks": 2},
                   {"op": "every-rank", "load_gbps": 1.0, "ranks": 2},
                   {"op": "rank0-broadcast", "load_gbps": 2.0, "ranks": 2}], kind="modelload")
    loads = dl.model_loads([("nvme", "x.json")], [Tier("s3", 1.0, 0.5, "--tier")], 24e9, 8 * 3600, lambda path: rec)
    assert [m.tier for m in loads] == ["nvme", "s3"]
    assert loads[0].load_s == pytest.approx(12.0) and loads[0].restarts_per_day == 3 and loads[0].per_day_s == 36
    assert loads[1].load_s == pytest.approx(48.0)


def test_wrong_records_and_rates_are_refused():
    with pytest.raises(UsageError, match="not a dataload record"):
        dl.rate_from_record(_record([], kind="checkpoint"), "c.json", None)
    with pytest.raises(UsageError, match="--data-rate"):
        dl.rate_from_text("4000", None)
    assert dl.rate_from_text("s3=900/s", None).samples_per_s_per_rank == 900
