import json

import pytest
from conftest import last_line, one_error_line

from microbench.results import RecordWriter, new_record


def _record(tmp_path, name):
    rec = new_record("nccl", {}, {}, {})
    rec["rows"] = [{"op": "all_gather", "placement": "out", "size_bytes": s, "busbw_gbps": g}
                   for s, g in ((1 << 20, 0.5), (4 << 20, 0.9), (16 << 20, 1.1))]
    return RecordWriter(rec, tmp_path / name).finish("complete")


def test_plot_overlays_records_and_never_overwrites(cli, tmp_path):
    pytest.importorskip("matplotlib")
    a, b = _record(tmp_path, "a.json"), _record(tmp_path, "b.json")
    out = tmp_path / "cmp.png"
    done = cli("plot", f"1gbit={a}", f"unlimited={b}", "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    again = cli("plot", str(a), "--out", str(out))
    assert again.returncode == 2 and "never overwritten" in last_line(again.stderr)
    bad = cli("plot", str(a), "--metric", "iops", "--out", str(tmp_path / "x.png"))
    assert bad.returncode == 2
    assert last_line(bad.stderr) == "microbench: invalid --metric 'iops': this record has busbw_gbps"


def test_a_skipped_record_says_why_it_has_nothing_to_plot():
    from microbench.accept.plots import pick_metric
    from microbench.core.errors import UsageError

    record = {"kind": "storage_gds", "status": "skipped", "status_reason": "storage gds: kvikio is not installed",
              "rows": []}
    with pytest.raises(UsageError, match=r"was skipped \(storage gds: kvikio is not installed\)"):
        pick_metric(record, None)


@pytest.mark.root
def test_plot_onto_a_read_only_filesystem(cli, tmp_path, read_only_dir):
    record = {"schema_version": 1, "kind": "nccl", "status": "complete", "config": {}, "environment": {},
              "implementation": {}, "rows": [{"op": "all_reduce", "size_bytes": 1 << 20, "busbw_gbps": 1.0}]}
    (tmp_path / "r.json").write_text(json.dumps(record))
    done = cli("plot", "r.json", "--out", str(read_only_dir / "p.png"), timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    line = one_error_line(done.stderr)
    assert "cannot write --out" in line and "Read-only file system" in line
    assert list(read_only_dir.iterdir()) == []
