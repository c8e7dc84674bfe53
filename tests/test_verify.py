"""FSDP2 verification on real gloo ranks: the record holds a prediction, a measurement and the error."""

import json
import math

from conftest import last_line


def test_verify_fsdp_predicts_and_measures(run_cli, tmp_path):
    out = tmp_path / "v.json"
    done = run_cli("verify", "fsdp", "--nproc", "2", "--hidden", "128", "--layers", "2", "--tokens", "256",
                   "--steps", "3", "--json", str(out), timeout=240)
    assert done.returncode == 0, done.stderr
    assert "predicted step" in done.stdout and "measured step" in done.stdout
    record = json.loads(out.read_text())
    assert record["status"] == "complete" and record["kind"] == "verify-fsdp"
    row = record["rows"][0]
    assert len(row["measured_steps_s"]) == 3 and row["measured_step_s"] > 0
    pred = row["predicted"]
    assert pred["full_overlap_s"] <= pred["step_s"] <= pred["no_overlap_s"]
    assert math.isfinite(row["error_pct"])
    assert row["error_pct"] == 100 * (pred["step_s"] - row["measured_step_s"]) / row["measured_step_s"]


def test_verify_rejects_bad_sizes(run_cli):
    done = run_cli("verify", "fsdp", "--hidden", "0")
    assert done.returncode == 2
    assert last_line(done.stderr) == "microbench: invalid --hidden '0': must be at least 1, e.g. 256"
