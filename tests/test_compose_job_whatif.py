"""The job what-if (compose/job/whatif.py) and the tier options it needs (compose/tiers/options.py):
golden inputs, totals and flip factors worked out by hand."""

import pytest

from microbench.compose.tiers import described
from microbench.compose.dataload import DataRate, ModelLoad
from microbench.compose.job.inputs import CkptTarget, JobAsk
from microbench.compose.job.assignment import Assignment
from microbench.compose.job.whatif import JobModel, whatif
from microbench.core.errors import UsageError


def _target(name, save_s, durable=True):
    return CkptTarget(name, durable, True, "blocking save", lambda f, s=save_s: (s / f, 0.0, True, 0.0))


def _model(targets, steps=2, every=1, data=None, loads=None, step_s=1.0):
    names = [t.name for t in targets]
    data = data or {"d": DataRate("d", 1e9, True, "test")}
    loads = loads or {n: ModelLoad(n, 1.0, 1e9, 1.0, "test") for n in names}
    return JobModel(JobAsk(steps, every, False, 100, None, None, None, "test"), {"net": step_s}, 1, data, loads,
                    {"net": {t.name: t for t in targets}}, 1800.0,
                    {"data": list(data), "model_from": list(loads), "ckpt_to": names}, False)


def test_the_recommendation_is_the_fastest_durable_assignment_resuming_from_its_checkpoint():
    # 2 steps of 1 s, a checkpoint after step 1 and the final save: total = load 1 + 2 + 2 x save.
    m = _model([_target("fast_local", 1.0, durable=False), _target("a", 10.0), _target("b", 20.0)])
    res = whatif(m)
    assert res.outcomes[0].config == Assignment("d", "fast_local", "fast_local", "net")
    assert res.outcomes[0].total_s == pytest.approx(1 + 2 + 2) and "ephemeral checkpoint" in res.outcomes[0].marks
    assert res.best.config == Assignment("d", "a", "a", "net") and res.best.total_s == pytest.approx(23)
    assert res.worst.config == Assignment("d", "b", "b", "net") and res.worst.total_s == pytest.approx(43)
    assert res.end_to_end == pytest.approx(43 / 23)
    resumes_elsewhere = [o for o in res.outcomes if o.config.model_from != o.config.ckpt_to]
    assert resumes_elsewhere and all(not o.allowed and any("resumes from" in k for k in o.marks)
                                     for o in resumes_elsewhere)


def test_the_flip_factor_is_where_the_other_tier_would_win():
    # b's two saves (40 s) beat a's (20 s) once b is more than 2x faster; the ephemeral tier never counts.
    res = whatif(_model([_target("fast_local", 1.0, durable=False), _target("a", 10.0), _target("b", 20.0)]))
    flips = {f.phase: f for f in res.flips}
    assert flips["ckpt_to"].alternative == "b" and flips["ckpt_to"].factor == pytest.approx(2.0, rel=1e-3)
    assert flips["data"].factor is None and flips["data"].alternative is None


def test_a_phase_nothing_can_change_says_so_and_ties_are_named():
    # b 1000x slower than a: no factor up to 100x changes it; two data sources that both keep up tie.
    data = {"x": DataRate("x", 1e9, True, "t"), "y": DataRate("y", 2e9, True, "t")}
    res = whatif(_model([_target("a", 1.0), _target("b", 1000.0)], data=data))
    flips = {f.phase: f for f in res.flips}
    assert flips["ckpt_to"].factor is None
    assert flips["data"].ties == ["x"] and flips["data"].recommended == "y"   # more headroom wins the tie


def test_a_model_load_flip_moves_the_checkpoint_tier_with_it():
    # a: load 50 s, save 1 s; b: load 1 s, save 2 s. 2 saves: a = 50+2+2 = 54, b = 1+2+4 = 7: b wins.
    # For a to win on its load alone: 50/f + 4 < 7 -> f > 50/3.
    loads = {"a": ModelLoad("a", 1.0, 1e9, 50.0, "t"), "b": ModelLoad("b", 1.0, 1e9, 1.0, "t")}
    res = whatif(_model([_target("a", 1.0), _target("b", 2.0)], loads=loads))
    assert res.best.config.ckpt_to == "b" and res.best.total_s == pytest.approx(7)
    flips = {f.phase: f for f in res.flips}
    assert flips["model_from"].alternative == "a" and flips["model_from"].factor == pytest.approx(50 / 3, rel=1e-3)


def test_an_interval_shorter_than_every_save_is_refused_with_the_numbers():
    m = _model([_target("a", 100.0)], every=None)
    m.interval_s = 60.0
    with pytest.raises(UsageError, match=r"ever trains.*60 s is shorter than one save \(100 s\)"):
        whatif(m)


def _tiers(*texts):
    return described.resolve([described.parse(text) for text in texts])


def test_ephemeral_tiers_are_not_durable_and_others_are():
    by = {t.name: t for t in _tiers("nvme=10:10,ephemeral", "shared=1.6:6.4", "s=2:4,durable")}
    assert by["nvme"].durable is False and by["shared"].durable and by["s"].durable
    assert (by["nvme"].write_gbps, by["nvme"].read_gbps) == (10, 10)
    assert by["nvme"].as_dict()["durable"] is False and by["nvme"].as_dict()["tier"] == "nvme"


def test_a_cached_mount_without_drain_caches_on_the_fastest_ephemeral_tier_and_drains_at_its_own_rate():
    by = {t.name: t for t in _tiers("cached=0.3:0.3,cached", "nvme=10:10,ephemeral", "slow=2:2,ephemeral")}
    mount = by["cached"].mount
    assert by["cached"].write_gbps == 10 and mount.write_gbps == 10 and mount.drain_gbps == pytest.approx(0.3)
    assert mount.cached and by["cached"].read_gbps == 0.3 and by["cached"].durable
    assert "nvme's write (10 GB/s)" in by["cached"].note
    given = {t.name: t for t in _tiers("c=0.3:0.3,cached,cache=4")}["c"]
    assert given.write_gbps == 4 and given.mount.drain_gbps == pytest.approx(0.3) and "cache=GB/S given" in given.note
    old = {t.name: t for t in _tiers("b=10:20,cached,drain=1")}["b"]    # the older form keeps its meaning
    assert old.write_gbps == 10 and old.mount.drain_gbps == 1 and old.note is None and "note" not in old.as_dict()


def test_a_cached_mount_with_nowhere_to_cache_is_refused_with_examples():
    with pytest.raises(UsageError, match=r"needs drain=GB/S.*or cache=GB/S, or an ephemeral local tier"):
        _tiers("cached=0.3:0.3,cached", "shared=1.6:6.4")
    with pytest.raises(UsageError, match="give ephemeral or durable once"):
        _tiers("n=1:1,ephemeral,durable")
    with pytest.raises(UsageError, match="cache= is for a cached mount without drain="):
        _tiers("b=1:1,cached,drain=1,cache=3")


def test_the_closed_form_total_is_the_timelines_over_random_jobs():
    import random

    from microbench.compose.job.timeline import JobPlan, PhaseCosts, timeline
    from microbench.compose.job.whatif import total_s

    rng = random.Random(23)
    for _ in range(3000):
        steps = rng.randint(1, 60)
        plan = JobPlan(steps, rng.choice([None, 1, 2, 3, 5, 7, steps, steps + 4]), final_save=rng.random() > 0.2,
                       tokens_per_step=10)
        costs = PhaseCosts(rng.choice([0.0, rng.uniform(0, 50)]), rng.uniform(0.1, 10),
                           rng.choice([0.0, rng.uniform(0, 3)]), rng.choice([0.0, rng.uniform(0, 30)]),
                           rng.choice([0.0, rng.uniform(0, 80)]), rng.random() > 0.5,
                           rng.choice([0.0, 0.0, rng.uniform(0, 20)]))   # a write-back's delay, at most the drain
        assert total_s(plan, costs) == pytest.approx(timeline(plan, costs).total_s, rel=1e-9, abs=1e-9), (plan, costs)
