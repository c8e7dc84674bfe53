"""`microbench compose --steps ...` (issue 23): the acceptance command, its numbers against a hand
calculation, the record, and each bad input as one line with exit 2."""

import json

import pytest

from conftest import one_error_line

ACCEPT = ["compose", "--model", "gemma-3-12b", "--nodes", "2", "--gpus-per-node", "8", "--gpu", "h100",
          "--micro-batch", "1", "--seq-len", "8192", "--grad-accum", "8", "--steps", "80", "--ckpt-every", "5",
          "--net", "eth=1.6GB/s", "--net", "ib=40GB/s", "--tier", "nvme=10:10,ephemeral", "--tier", "shared=1.6:6.4",
          "--tier", "mount=0.1:0.3", "--tier", "cached=0.3:0.3,cached"]


@pytest.fixture(scope="module")
def accepted(tmp_path_factory):
    import subprocess
    import sys

    from conftest import cli_env

    tmp = tmp_path_factory.mktemp("job")
    res = subprocess.run([sys.executable, "-m", "microbench", *ACCEPT, "--json", str(tmp / "job.json")], cwd=tmp,
                         env=cli_env(None), capture_output=True, text=True, timeout=300)
    return res, json.loads((tmp / "job.json").read_text()) if res.returncode == 0 else None


@pytest.mark.slow
def test_the_acceptance_command_prints_the_job_the_ranked_whatif_and_the_recommendation(accepted):
    res, record = accepted
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert "## job: 80 steps" in out and "[DOES NOT FIT in memory" in out.split("## job:")[1].splitlines()[0]
    assert "tokens/s over the whole job" in out and "of the job on I/O" in out
    assert "## what-if: 2 network(s) x every storage assignment (128 configurations)" in out
    assert "RECOMMENDED" in out and "ephemeral checkpoint" in out and "resumes from" in out
    assert "# end to end:" in out and "to change the answer" in out
    assert "the save blocks on the cache write at the fastest ephemeral tier given, nvme's write" in out
    job = record["summary"]["job"]
    assert job["recommended"]["network"] == "ib" and job["recommended"]["ckpt_to"] == job["recommended"]["model_from"]
    assert len(job["configurations"]) == 128 and job["timelines"][job["configurations"][0]["timeline"]]["phases"]
    # the data tier changes no cost here (every loader keeps up) and mount and cached read alike (0.3):
    # one timeline per network x 3 load times x 4 checkpoint tiers, shared by the rest
    assert len(job["timelines"]) == 2 * 3 * 4
    rows = [r for r in record["rows"] if r["op"] == "job"]
    assert len(rows) == 128 and [r["rank"] for r in rows] == list(range(1, 129))
    assert sum(r["recommended"] for r in rows) == 1


@pytest.mark.slow
def test_the_acceptance_totals_match_a_hand_calculation(accepted):
    res, record = accepted
    params = record["config"]["model"]["total_params"]
    step = {r["network"]: r["step_s"] for r in record["rows"] if r["op"] == "step"}
    weights, ckpt = 2 * params, 12 * params              # bf16 weights; fp32 master + AdamW's two moments
    job = record["summary"]["job"]
    by = {(c["network"], c["data"], c["model_from"], c["ckpt_to"]): job["timelines"][c["timeline"]]
          for c in job["configurations"]}
    # ib, model and checkpoints on shared (1.6 write, 6.4 read): load + 80 steps + 15 saves + the final save.
    shared = by[("ib", "shared", "shared", "shared")]
    assert shared["total_s"] == pytest.approx(weights / 6.4e9 + 80 * step["ib"] + 16 * ckpt / 1.6e9, rel=1e-9)
    # The cached mount: each save blocks on the cache (nvme, 10 GB/s); uploads at 0.3 GB/s take longer
    # than 5 steps, so they queue back to back from the first save and the job ends when the 16th is up.
    cached = by[("ib", "shared", "cached", "cached")]
    first_save_done = weights / 0.3e9 + 5 * step["ib"] + ckpt / 10e9
    assert cached["total_s"] == pytest.approx(first_save_done + 16 * ckpt / 0.3e9, rel=1e-9)
    # tokens/s over the whole job: 80 steps x 16 ranks x 8 x 8192 tokens.
    assert shared["tokens_per_s"] == pytest.approx(80 * 16 * 8 * 8192 / shared["total_s"])
    rec = record["summary"]["job"]["recommended"]
    assert rec["total_s"] == pytest.approx(shared["total_s"])     # data ties: every tier keeps up here


BASE = ["compose", "--model", "gemma-3-12b", "--nodes", "2", "--gpus-per-node", "8", "--gpu", "h100",
        "--net", "ib=40GB/s", "--tier", "shared=1.6:6.4", "--tier", "w=1", "--tier", "mount=0.1:0.3"]


@pytest.mark.parametrize("extra, words", [
    (["--steps", "0"], "invalid --steps '0': must be at least 1, e.g. 80"),
    (["--steps", "10", "--ckpt-every", "0"], "invalid --ckpt-every '0': must be at least 1, e.g. 5"),
    (["--steps", "10", "--ckpt-to", "foo"], "--ckpt-to foo: no such tier; expected one of shared, w, mount, "
                                            "e.g. --tier foo=1.6:6.4 --ckpt-to foo"),
    (["--steps", "10", "--data", "w"], "--data w: tier 'w' has no read bandwidth"),
    (["--steps", "10", "--model-from", "w"], "--model-from w: tier 'w' has no read bandwidth"),
    (["--steps", "10", "--ckpt-interval", "60s", "--ckpt-to", "mount"],
     "--ckpt-to mount on ib: --ckpt-interval 60 s is shorter than one save (1.46e+03 s): the job would never train"),
    (["--steps", "10", "--ckpt-interval", "10s"], "no configuration ever trains: --ckpt-interval 10 s is shorter"),
    (["--ckpt-every", "5"], "--ckpt-every describes a job: give its length too, e.g. --steps 80"),
    (["--steps", "5", "--tokens", "1e9"], "give one, e.g. --steps 80"),
])
def test_bad_job_input_is_one_line_and_exit_2_before_any_output(cli, extra, words):
    res = cli(*BASE, *extra)
    assert res.returncode == 2, res.stdout + res.stderr
    assert words in one_error_line(res.stderr)
    assert res.stdout == ""


def test_without_steps_compose_prints_no_job_and_takes_an_ephemeral_tier(cli):
    res = cli(*BASE, "--tier", "nvme=10:10,ephemeral")
    assert res.returncode == 0, res.stderr
    assert "nvme    10.00 GB/s" in res.stdout
    assert "## job" not in res.stdout and "## recommendation" not in res.stdout


def test_tokens_a_slow_loader_and_the_interval_give_the_job_by_hand(cli, tmp_path):
    # One network, one tier; a described loader of 0.5 samples/s per rank: 8 samples per step take
    # 16 s, the stall is what the step does not hide. 1e8 tokens at 1,048,576 per step: 96 steps.
    # --ckpt-interval 20min without --ckpt-every: (1200 s - save) / (step + stall) steps.
    res = cli("compose", "--model", "gemma-3-12b", "--nodes", "2", "--gpus-per-node", "8", "--gpu", "h100",
                  "--seq-len", "8192", "--grad-accum", "8", "--net", "ib=40GB/s", "--tier", "shared=1.6:6.4",
                  "--data-rate", "slow=0.5", "--data", "slow", "--tokens", "1e8", "--ckpt-interval", "20min",
                  "--json", str(tmp_path / "j.json"))
    assert res.returncode == 0, res.stderr
    record = json.loads((tmp_path / "j.json").read_text())
    step = [r["step_s"] for r in record["rows"] if r["op"] == "step"][0]
    params = record["config"]["model"]["total_params"]
    save = 12 * params / 1.6e9
    stall = 16.0 - step
    assert stall > 0                                    # the loader, not the step, sets the pace here
    every = int((1200 - save) // (step + stall))
    (conf,) = record["summary"]["job"]["configurations"]
    tl = record["summary"]["job"]["timelines"][conf["timeline"]]
    assert tl["plan"]["steps"] == 96 and tl["plan"]["ckpt_every"] == every
    saves = len(range(every, 96, every)) + 1
    assert tl["total_s"] == pytest.approx(2 * params / 6.4e9 + 96 * (step + stall) + saves * save, rel=1e-9)
    assert tl["time_by_kind_s"]["data_stall"] == pytest.approx(96 * stall)
    assert "--tokens 1e8: 96 steps of 1,048,576 tokens" in res.stdout and "data stall" in res.stdout
