"""What `microbench report`, the suite table and verify show a reader (issue 20 item 25): both
storage directions plotted, link columns labelled with one RTT p50 per size, the suite's
headline saying it is each op's best size, and a negative implied overlap explained."""

from __future__ import annotations

import re

import pytest

from microbench.accept import report
from microbench.accept.suite import headline
from microbench.results import RecordWriter, new_record

pytest.importorskip("matplotlib")


def _write(tmp_path, name, kind, rows, impl=None):
    rec = new_record(kind, {"world": {"size": 2}}, {}, impl or {})
    rec["rows"] = rows
    return RecordWriter(rec, tmp_path / name).finish("complete")


def _time(p50):
    return {"p50": p50, "p95": p50, "p99": p50, "min": p50, "max": p50, "mean": p50, "n": 5}


def _html(path):
    return report.build(report.load_runs([str(path)]), generated="t")


def test_storage_posix_plots_both_read_and_write(tmp_path):
    rows = [{"probe": "storage_posix", "op": op, "size_bytes": s, "tool": "posix", key: g, "iops": 100.0,
             "lat_us_p50": 50.0, "time_us": _time(1000.0)}
            for op, key in (("read", "read_gbps"), ("write", "write_gbps")) for s, g in ((1 << 20, 1.0), (16 << 20, 2.0))]
    text = _html(_write(tmp_path, "posix.json", "storage_posix", rows, {"engine": "io_uring"}))
    alts = re.findall(r'<img class="plot" alt="([^"]+)"', text)
    assert "storage_posix: read vs size" in alts and "storage_posix: write vs size" in alts, alts


def test_link_tables_label_their_columns_and_show_one_rtt_p50_per_size(tmp_path):
    rows = [{"probe": "link", "op": "uni", "size_bytes": 1 << 20, "streams": 1, "bw_gbps": 3.6, "bw_gbit_s": 29.3,
             "time_us": _time(290.0)},
            {"probe": "link", "op": "rtt", "size_bytes": 4096, "streams": 1, "batch": 200, "rtt_us_p50": 16.7,
             "rtt_us_p99": 102.1, "rtt_samples": 2400, "time_us": _time(3340.0)}]
    text = _html(_write(tmp_path, "link.json", "link", rows, {"engine": "native"}))
    heads = re.findall(r"<th>([^<]*)</th>", text)
    assert "bw Gbit/s" in heads and "rtt p50 us" in heads
    assert not {"bw_gbit_s", "rtt_us_p50"} & set(heads)
    # The rtt row: its own p50 (16.7), not also its batch's time p50 (3,340).
    rtt_row = next(r for r in re.findall(r"<tr>(.*?)</tr>", text) if "<td>rtt" in r)
    assert "16.7" in rtt_row and "3,340" not in rtt_row


def test_the_suite_headline_says_it_is_each_ops_best_size():
    from microbench.accept.suite import HEADLINE_COLUMN

    record = {"kind": "nccl", "rows": [
        {"op": "all_reduce", "size_bytes": 1 << 20, "busbw_gbps": 0.4, "algbw_gbps": 0.4},
        {"op": "all_reduce", "size_bytes": 16 << 20, "busbw_gbps": 1.6, "algbw_gbps": 1.6},
        {"op": "all_reduce", "size_bytes": 64 << 20, "busbw_gbps": 1.2, "algbw_gbps": 1.2}]}
    assert headline(record) == "all_reduce busbw 1.60 GB/s at 16M"
    assert "best size" in HEADLINE_COLUMN


def test_verify_explains_a_negative_implied_overlap(capsys):
    from microbench.verify.fsdp.report import overlap_note

    rows = [{"parts": {"overlap": {"used": 0.3, "implied_by_step": -0.64}}}]
    note = overlap_note(rows)
    assert "below 0 (-0.64) the step took longer than its parts run one after another" in note
    assert "0 = nothing hidden" in note
