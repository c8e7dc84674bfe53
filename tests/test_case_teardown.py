"""The runner's teardown of one case: release after a case that ran to its end, abandon (no
collective) when this rank leaves it early, since its peers may be inside any collective of the
case and would wait on one entered here until the timeout."""

from __future__ import annotations

import pytest

from microbench.core.probe import Case, Probe
from microbench.run.runner import SweepSettings, measure_case


class Recorder(Probe):
    name = "recorder"

    def __init__(self, fail_at: int | None = None, error: type[BaseException] = KeyboardInterrupt):
        self.calls: list[str] = []
        self.runs, self.fail_at, self.error = 0, fail_at, error

    def cases(self):
        return [Case(op="fill", size_bytes=4096)]

    def run_once(self, case):
        self.runs += 1
        if self.runs == self.fail_at:
            raise self.error("stop here")

    def release(self, case):
        self.calls.append("release")

    def abandon(self, case):
        self.calls.append("abandon")


SETTINGS = SweepSettings(warmup=1, iters=3, budget_s_per_case=None, check=False, progress=False)


def test_a_case_run_to_its_end_is_released():
    probe = Recorder()
    row = measure_case(probe, probe.cases()[0], SETTINGS, None)
    assert probe.calls == ["release"] and row["iters"] == 3


@pytest.mark.parametrize("error", [KeyboardInterrupt, RuntimeError])
def test_a_case_left_early_is_abandoned_not_released(error):
    probe = Recorder(fail_at=3, error=error)
    with pytest.raises(error):
        measure_case(probe, probe.cases()[0], SETTINGS, None)
    assert probe.calls == ["abandon"]


def test_abandon_defaults_to_release_for_probes_that_free_local_things_only():
    class Local(Probe):
        def __init__(self):
            self.freed = False

        def release(self, case):
            self.freed = True

    probe = Local()
    probe.abandon(Case(op="x", size_bytes=1))
    assert probe.freed


def test_the_checkpoint_probe_abandons_without_a_barrier():
    from microbench.probes.checkpoint import CheckpointProbe

    class NoCollectives:
        def barrier(self):
            raise AssertionError("abandon entered a collective")

    probe = CheckpointProbe.__new__(CheckpointProbe)
    probe.world, probe.dest, probe.last_step = NoCollectives(), object(), "step-3"
    probe.abandon(Case(op="load", size_bytes=1 << 20))
    assert probe.dest is None and probe.last_step is None
