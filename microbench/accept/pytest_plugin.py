"""pytest-benchmark integration: time a probe's case with pytest-benchmark, so its statistics,
saved runs (--benchmark-autosave, --benchmark-json) and comparisons (--benchmark-compare) work on
microbench probes. Registered as a pytest plugin by the package; the fixture needs
pytest-benchmark and skips with its reason when that or the probe is unavailable.

    def test_host_memcpy(probe_benchmark):
        from microbench.core.probe import Case
        from microbench.probes.memory import Config, MemoryProbe
        info = probe_benchmark(MemoryProbe(Config(sizes=[64 << 20])), Case("memcpy_1t", 64 << 20))
        assert info["copy_gbps"] > 0

Only probes that run in one process fit here; a probe whose spec needs a world (the registry's
`Needs.world`) needs its ranks, so it is skipped with that reason: compare its saved records
with `microbench compare` or `microbench plot` instead.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import pytest

from ..core import registry
from ..core.probe import Timed


class _ProbeClock:
    """Advances only by what each round measured."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def probe_benchmark(request: Any) -> Callable[..., dict[str, Any]]:
    try:
        benchmark = request.getfixturevalue("benchmark")
    except pytest.FixtureLookupError:
        pytest.skip("probe_benchmark needs pytest-benchmark (pip install pytest-benchmark)")

    def run(probe: Any, case: Any, *, rounds: int = 5, warmup_rounds: int = 1) -> dict[str, Any]:
        spec = registry.find(str(getattr(probe, "name", "")))
        if spec is not None and spec.needs.world:
            pytest.skip(f"{probe.name}: runs on every rank of a world; probe_benchmark times one process")
        reason = probe.unavailable_reason()
        if reason:
            pytest.skip(f"{probe.name}: {reason}")
        clock = _ProbeClock()
        probe.prepare(case)
        try:

            def once() -> None:
                start = time.perf_counter()
                out = probe.run_once(case)
                probe.sync()
                clock.now += out.time_s if isinstance(out, Timed) else time.perf_counter() - start

            # A probe that times itself (a native loop returning Timed) must be judged by its own
            # clock, not by the wall time of the Python call around it: pytest-benchmark reads
            # this timer before and after each round (pedantic mode does no calibration).
            benchmark._timer = clock
            benchmark.pedantic(once, rounds=rounds, warmup_rounds=warmup_rounds, iterations=1)
            nwrong = probe.check(case)
        finally:
            probe.release(case)
        median_s = benchmark.stats.stats.median
        benchmark.extra_info.update(
            {
                "probe": probe.name,
                "op": case.op,
                "size_bytes": case.size_bytes,
                **dict(case.params),
                "nwrong": nwrong,
                **probe.metrics(case, median_s),
                "implementation": probe.implementation(),
            }
        )
        return benchmark.extra_info

    return run
