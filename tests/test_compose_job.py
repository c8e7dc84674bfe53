"""The job timeline (compose/job/timeline.py): golden inputs, hand-computed totals."""

import pytest

from microbench.compose.job.timeline import (JobPlan, PhaseCosts, checkpoint_steps, every_for_interval, steps_for_tokens,
                                    timeline)
from microbench.core.errors import UsageError


def test_a_synchronous_job_adds_load_steps_stalls_and_saves():
    plan = JobPlan(steps=10, ckpt_every=5, tokens_per_step=1000)
    costs = PhaseCosts(model_load_s=30, step_s=2, data_stall_s=0.5, save_blocking_s=20)
    job = timeline(plan, costs)
    # 30 load + 10 x 2.5 + one periodic save (after step 5) + the final save (after step 10)
    assert job.total_s == pytest.approx(30 + 25 + 20 + 20)
    assert checkpoint_steps(plan) == [5]
    kinds = job.time_by_kind()
    assert kinds["train"] == pytest.approx(20) and kinds["data_stall"] == pytest.approx(5)
    assert kinds["ckpt_blocking"] == pytest.approx(20) and kinds["final_save"] == pytest.approx(20)
    assert job.tokens_per_s == pytest.approx(10 * 1000 / 95)
    assert job.io_share == pytest.approx((30 + 5 + 20 + 20) / 95)
    assert sum(job.share_by_kind().values()) == pytest.approx(1.0)
    assert [p.name for p in job.phases][:3] == ["model load", "steps 1-5", "data stall, steps 1-5"]


def test_an_async_drain_overlaps_the_next_steps_and_costs_nothing_when_it_fits():
    plan = JobPlan(steps=9, ckpt_every=3, async_ckpt=True)
    costs = PhaseCosts(model_load_s=0, step_s=10, save_blocking_s=1, save_drain_s=25)
    job = timeline(plan, costs)
    # checkpoints after steps 3 and 6; each drain (25 s) ends before the next save (30 s of steps)
    # the final save is blocking + drain, nothing to overlap with
    assert job.total_s == pytest.approx(90 + 1 + 1 + 26)
    drains = [p for p in job.phases if p.kind == "ckpt_drain"]
    assert len(drains) == 2 and all(p.overlapped for p in drains)
    assert job.time_by_kind()["ckpt_wait"] == 0


def test_an_async_drain_longer_than_the_interval_makes_the_next_save_wait():
    plan = JobPlan(steps=4, ckpt_every=1, async_ckpt=True)
    costs = PhaseCosts(model_load_s=0, step_s=10, save_blocking_s=2, save_drain_s=15)
    job = timeline(plan, costs)
    # t=10 save 1 blocks 2 (drain to 27); t=22 wait 5; save 2 at 27..29 (drain to 44); t=39 wait 5;
    # save 3 44..46 (drain to 61); t=56 wait 5; final save from 61: 2 + 15
    assert job.time_by_kind()["ckpt_wait"] == pytest.approx(15)
    assert job.total_s == pytest.approx(61 + 17)


def test_a_queued_write_back_does_not_block_the_next_save_but_delays_the_final_one():
    plan = JobPlan(steps=2, ckpt_every=1)
    costs = PhaseCosts(model_load_s=0, step_s=1, save_blocking_s=1, save_drain_s=10, drain_blocks_next=False)
    job = timeline(plan, costs)
    # t=1 save 1 (cache write) 1..2, upload 2..12; t=3 final save: write 3..4, upload queued 12..22
    assert job.time_by_kind()["ckpt_wait"] == 0
    assert job.total_s == pytest.approx(22)
    final = [p for p in job.phases if p.kind == "final_save"][0]
    assert final.start_s == pytest.approx(3) and final.time_s == pytest.approx(19)


def test_no_periodic_checkpoints_and_no_final_save():
    job = timeline(JobPlan(steps=3, final_save=False), PhaseCosts(model_load_s=1, step_s=2, save_blocking_s=9))
    assert job.total_s == pytest.approx(7)
    assert [p.kind for p in job.phases] == ["model_load", "train"]


def test_a_checkpoint_on_the_last_step_is_the_final_save_not_a_second_one():
    assert checkpoint_steps(JobPlan(steps=10, ckpt_every=5)) == [5]
    assert checkpoint_steps(JobPlan(steps=11, ckpt_every=5)) == [5, 10]


def test_tokens_and_intervals_convert_to_steps():
    assert steps_for_tokens(1_000_001, 1000) == 1001
    assert every_for_interval(interval_s=100, step_s=10, save_s=15) == 8


@pytest.mark.parametrize("kwargs, word", [({"steps": 0}, "--steps 0"), ({"steps": 5, "ckpt_every": 0}, "--ckpt-every 0")])
def test_zero_steps_or_interval_is_misuse_quoting_the_value(kwargs, word):
    with pytest.raises(UsageError, match=word):
        JobPlan(**kwargs)


def test_an_interval_shorter_than_the_save_never_trains():
    with pytest.raises(UsageError, match=r"shorter than one save \(120 s\).*never train"):
        every_for_interval(interval_s=60, step_s=1, save_s=120)
