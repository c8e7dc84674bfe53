"""Verdicts that know the noise (verify/noise.py, the reports' verdicts): the interval of a median
from its readings, the widening by the load other processes put on the machine, and golden rows
that must come out PASS, FAIL or INCONCLUSIVE; the exit code and the one line each ends with."""

from __future__ import annotations

import json

import pytest

from microbench.core.errors import Inconclusive, RunError
from microbench.verify import noise
from microbench.verify.fsdp import report as fsdp_report
from microbench.verify.job import report as job_report
from microbench.world import load

QUIET = {"cpus": 2, "other_share": 0.01, "other_cpus": 0.02, "loadavg_1m": 0.1}
BUSY_CORE = {"cpus": 2, "other_share": 0.5, "other_cpus": 1.0, "loadavg_1m": 3.0}


# --------------------------------------------------------------------------- the interval of a median

@pytest.mark.parametrize("n, j, covered", [(6, 1, 1 - 2 / 64), (6, 2, 1 - 2 * 7 / 64), (9, 2, 1 - 2 * 10 / 512),
                                           (1, 1, 0.0)])
def test_order_statistics_cover_the_median_with_the_binomial_probability(n, j, covered):
    assert noise.coverage(n, j) == pytest.approx(covered)


@pytest.mark.parametrize("values, low, high", [
    ([5, 1, 4, 2, 6, 3], 1, 6),                       # 6 readings: only min..max covers 90 % (97 %)
    (list(range(1, 10)), 2, 8),                       # 9: the 2nd smallest to the 2nd largest (96 %)
    (list(range(1, 13)), 3, 10),                      # 12: the 3rd to the 10th (96 %; the 4th to 9th is 85 %)
])
def test_the_median_interval_is_the_narrowest_pair_covering_ninety_percent(values, low, high):
    got_low, got_high, cov = noise.median_interval(values)
    assert (got_low, got_high) == (low, high) and cov >= noise.CONFIDENCE


def test_the_load_widens_the_interval_by_either_side_slowed_up_to_one_over_one_minus_share():
    assert noise.widened(-2.0, 4.0, None) == pytest.approx((-2.0, 4.0))
    assert noise.widened(0.0, 0.0, 0.5) == pytest.approx((-50.0, 100.0))
    assert noise.widened(-10.0, 10.0, 0.2) == pytest.approx((100 * (0.9 * 0.8 - 1), 100 * (1.1 / 0.8 - 1)))


# --------------------------------------------------------------------------- golden step rows

def step_row(errors_pct, profile="loopback"):
    """A step row whose steps were predicted with the given errors (measured 100 ms each)."""
    measured = [0.1] * len(errors_pct)
    predicted = [0.1 * (1 + e / 100) for e in errors_pct]
    median = sorted(errors_pct)[len(errors_pct) // 2 - 1: len(errors_pct) // 2 + 1]
    return {"kind": "step", "profile": profile, "model": "small", "tokens": 256,
            "predicted_steps_s": predicted, "measured_steps_s": measured,
            "error_pct": sum(median) / len(median) if len(errors_pct) % 2 == 0 else sorted(errors_pct)[len(errors_pct) // 2]}


@pytest.mark.parametrize("errors, load_seen, expected", [
    ([1.0, -2.0, 3.0, 0.5, -1.0, 2.0], QUIET, noise.PASS),              # tight, quiet: inside 10 %
    ([1.0, -2.0, 3.0, 0.5, -1.0, 2.0], BUSY_CORE, noise.INCONCLUSIVE),  # the same readings on a busy core
    ([1.0, -14.0, 9.0, 0.5, -1.0, 12.0], QUIET, noise.INCONCLUSIVE),    # median inside, readings across
    ([-22.0, -25.0, -24.0, -23.0, -21.0, -26.0], QUIET, noise.FAIL),    # wholly outside on a quiet machine
    ([-22.0, -25.0, -24.0, -23.0, -21.0, -26.0], BUSY_CORE, noise.INCONCLUSIVE),   # the busy core could do that
    ([900.0, 950.0, 1000.0, 980.0, 940.0, 990.0], BUSY_CORE, noise.FAIL),  # no load explains a 10x miss
])
def test_golden_step_rows(errors, load_seen, expected):
    v = fsdp_report.verdict([step_row(errors)], 10, 15, {"loopback": load_seen})
    assert v["verdict"] == expected
    assert v["pass"] == (expected == noise.PASS)
    assert bool(v["outside"]) == (expected == noise.FAIL)
    assert bool(v["inconclusive"]) == (expected == noise.INCONCLUSIVE)
    (judged,) = v["rows"]
    assert judged["verdict"] == expected and judged["readings"] == 6 and judged["other_share"] == load_seen["other_share"]


def test_an_inconclusive_row_names_its_spread_and_the_load_and_how_to_get_a_clean_verdict():
    v = fsdp_report.verdict([step_row([1.0, -2.0, 3.0, 0.5, -1.0, 2.0])], 10, 15, {"loopback": BUSY_CORE})
    (line,) = v["inconclusive"]
    assert line.startswith("loopback small 256 tokens: error +0.8%; its 6 readings put it at -2.0..+3.0% (97% coverage)")
    assert "other processes took 1.00 of 2 CPUs (50%), load average 3.00" in line and "+-10% tolerance" in line
    assert "rerun when the machine is quiet" in v["clean"] and "--steps" in v["clean"]


def test_checkpoint_parts_are_judged_on_their_own_paired_readings_and_the_checkpoint_phase_load():
    def part(errors):
        return {"predicted_s_each": [0.1 * (1 + e / 100) for e in errors], "measured_s_each": [0.1] * len(errors),
                "error_pct": sorted(errors)[len(errors) // 2]}

    row = {"kind": "checkpoint", "target": "s3", "wrong_loads": 0,
           "save": part([2, 3, 1, 2, 4, 3, 2, 1, 2]), "load": part([2, 30, -20, 1, 25, -18, 3, 2, 40])}
    v = fsdp_report.verdict([row], 10, 15, {"checkpoint": QUIET})
    assert v["verdict"] == noise.INCONCLUSIVE and v["outside"] == []
    assert [r["verdict"] for r in v["rows"]] == [noise.PASS, noise.INCONCLUSIVE]
    assert v["inconclusive"][0].startswith("checkpoint load to s3: error +2.0%; its 9 readings")


def test_rows_without_readings_are_judged_by_their_error_alone():
    rows = [{"kind": "step", "profile": "1gbit", "model": "small", "tokens": 256, "error_pct": 4.0},
            {"kind": "step", "profile": "1gbit", "model": "medium", "tokens": 512, "error_pct": -12.5}]
    v = fsdp_report.verdict(rows, 10, 15)
    assert v["verdict"] == noise.FAIL and v["outside"] == ["1gbit medium 512 tokens -12.5% (> 10%)"]


# --------------------------------------------------------------------------- golden job rows

def job_row(error_pct, replays, steps, saves=(), load_share=None):
    """A job whose train phase is 80 % of both totals and checkpoints 10 % of the measured one."""
    return {"kind": "job", "profile": "loopback", "assignment": "data=dir,model=dir,ckpt=dir",
            "total": {"error_pct": error_pct, "predicted_s": 10.0 * (1 + error_pct / 100), "measured_s": 10.0},
            "phases": {"train": {"predicted_s": 8.0 * (1 + error_pct / 100), "measured_s": 8.0},
                       "ckpt_blocking": {"predicted_s": 1.0, "measured_s": 1.0}},
            "measured": {"steps_s": list(steps), "saves_s": list(saves)},
            "inputs": {"step": {"replay_before_s": list(replays[:3]), "replay_after_s": list(replays[3:])}}}


def test_a_job_total_within_the_tolerance_with_steady_readings_passes():
    row = job_row(3.0, [0.100, 0.101, 0.099, 0.102, 0.100, 0.098], [0.66, 0.67, 0.66, 0.68, 0.67, 0.66] * 2,
                  [0.33, 0.34, 0.33])
    j = job_report.judge_job(row, 15, QUIET)
    assert j.verdict == noise.PASS
    # Interval arithmetic: the predicted side at the replays' extremes, the measured at the steps' and saves'.
    # 12 steps: the 3rd and 10th readings (0.66, 0.67) around their median 0.665; 3 saves: all of them.
    low = 100 * (1.03 * (1 + 0.8 * (0.098 / 0.100 - 1)) / (1 + 0.8 * (0.67 / 0.665 - 1) + 0.1 * (0.34 / 0.33 - 1)) - 1)
    assert j.interval_pct[0] == pytest.approx(low)
    assert j.readings == 6 + 12 + 3


def test_a_job_total_whose_readings_scatter_across_the_tolerance_is_inconclusive():
    row = job_row(8.0, [0.10, 0.13, 0.08, 0.12, 0.09, 0.14], [0.6, 0.8, 0.5, 0.9, 0.7, 0.6] * 2)
    v = job_report.verdict([row], 15, {"loopback": QUIET})
    assert v["verdict"] == noise.INCONCLUSIVE and v["outside"] == []
    assert v["inconclusive"][0].startswith("loopback data=dir,model=dir,ckpt=dir: error +8.0%; its 18 readings")


def test_a_job_total_far_outside_on_a_quiet_machine_fails_and_is_inconclusive_on_a_busy_core():
    row = job_row(-27.6, [0.100, 0.101, 0.099, 0.102, 0.100, 0.098], [0.66, 0.67, 0.66, 0.68, 0.67, 0.66] * 2)
    assert job_report.verdict([row], 15, {"loopback": QUIET})["verdict"] == noise.FAIL
    busy = job_report.verdict([row], 15, {"loopback": BUSY_CORE})
    assert busy["verdict"] == noise.INCONCLUSIVE and busy["outside"] == []


def test_a_wrong_sample_fails_whatever_the_noise():
    row = job_row(1.0, [0.1] * 6, [0.66] * 12)
    row["measured"]["data_wrong"] = 2
    v = job_report.verdict([row], 15, {"loopback": BUSY_CORE})
    assert v["verdict"] == noise.FAIL and v["outside"][-1].endswith("2 sample(s) read back wrong")


# --------------------------------------------------------------------------- exit codes

def test_fail_is_exit_1_and_inconclusive_exit_3_each_with_one_line(tmp_path):
    fail = fsdp_report.verdict([step_row([-22.0, -25.0, -24.0, -23.0, -21.0, -26.0])], 10, 15, {"loopback": QUIET})
    with pytest.raises(RunError) as failed:
        noise.exit_for(fail, tmp_path / "v.json")
    assert failed.value.exit_code == 1 and "1 configuration(s) outside the tolerance: loopback small 256" in str(failed.value)
    unsure = fsdp_report.verdict([step_row([1.0, -2.0, 3.0, 0.5, -1.0, 2.0])], 10, 15, {"loopback": BUSY_CORE})
    with pytest.raises(Inconclusive) as told:
        noise.exit_for(unsure, tmp_path / "v.json")
    text = str(told.value)
    assert told.value.exit_code == 3 and "\n" not in text
    assert text.startswith("1 configuration(s) inconclusive, noise alone could move them across the tolerance: "
                           "loopback small 256 tokens; rerun when the machine is quiet")
    passed = fsdp_report.verdict([step_row([1.0, -2.0, 3.0, 0.5, -1.0, 2.0])], 10, 15, {"loopback": QUIET})
    assert noise.exit_for(passed, tmp_path / "v.json") == 0


def test_the_cli_ends_an_inconclusive_verify_with_exit_3_and_one_line(monkeypatch, capsys):
    from microbench import cli
    from microbench.commands import verify as command

    def inconclusive(args):
        raise Inconclusive("1 configuration(s) inconclusive, noise alone could move them across the tolerance: x")

    monkeypatch.setattr(command.vrun, "run_fsdp", inconclusive)
    monkeypatch.setattr(command.launch, "refuse_in_world", lambda name: None)
    assert cli.main(["verify", "fsdp", "--model", "tiny"]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["microbench: 1 configuration(s) inconclusive, noise alone could move them across the tolerance: x"]


def test_the_report_prints_the_band_the_inconclusive_rows_and_the_verdict(capsys):
    row = step_row([1.0, -2.0, 3.0, 0.5, -1.0, 2.0])
    row.update(predicted_s=0.1, measured_s=0.1, spread_pct=5.0,
               parts={"compute": {"error_pct": 0}, "collectives": {"error_pct": None},
                      "overlap": {"implied_by_step": None}})
    record = {"rows": [row], "summary": {}}
    record["summary"]["verdict"] = fsdp_report.verdict(record["rows"], 10, 15, {"loopback": BUSY_CORE})
    fsdp_report.attach(record, record["summary"]["verdict"])
    fsdp_report.print_report(record, False)
    out = capsys.readouterr().out
    assert "-51..+106%" in out and "INCONCLUSIVE" in out
    assert "# inconclusive: loopback small 256 tokens: error +0.8%" in out
    assert out.rstrip().endswith("# verdict: INCONCLUSIVE (1 checked, 0 outside, 1 inconclusive |step error| <= 10%, "
                                 "|checkpoint error| <= 15%)")
    json.dumps(record)   # what the record keeps stays JSON


# --------------------------------------------------------------------------- the load meter

def test_the_load_is_what_the_cpus_ran_beyond_our_own_processes():
    start = load.Reading(wall_s=0.0, capacity=0, busy=0, steal=0, ours=0.0)
    end = load.Reading(wall_s=1.0, capacity=200, busy=150, steal=10, ours=50.0)
    seen = load.between(start, end)
    assert seen["other_share"] == pytest.approx(0.5) and seen["steal_share"] == pytest.approx(0.05)
    assert seen["other_cpus"] == pytest.approx(0.5 * seen["cpus"])
    assert load.between(None, end)["other_share"] is None


@pytest.mark.slow
def test_a_busy_child_of_ours_is_not_counted_as_other_load():
    import subprocess
    import sys
    import time

    before = load.read()
    # Half a second of its own CPU time, however busy the machine is.
    child = subprocess.Popen([sys.executable, "-c", "import time\nwhile time.process_time() < 0.5: pass"])
    child.wait()
    time.sleep(0.05)
    after = load.read()
    assert before is not None and after is not None
    assert after.ours - before.ours >= 0.45 * load.TICKS_PER_S   # the child's CPU is ours
