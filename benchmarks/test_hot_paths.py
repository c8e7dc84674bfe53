"""pytest-benchmark comparisons of microbench's hot paths, native core vs Python fallback.

    pytest benchmarks/test_hot_paths.py --benchmark-autosave        # save this machine's run
    pytest benchmarks/test_hot_paths.py --benchmark-compare         # compare with the last saved run

Each group holds the native and the fallback implementation of one path side by side. Read
the median: the mean of a handful of rounds on a shared machine is one preempted round away
from 1.5x (benchmarks/memcpy_ceiling.py compares this with `microbench memory`).
"""

import pytest

from microbench.targets import native
from microbench.core.probe import Case
from microbench.probes.memory import Config, MemoryProbe, copies_per_call

SIZE = 64 << 20


def memory_command_counts() -> tuple[int, int]:
    """(warm-up, timed iterations) `microbench memory` runs per case by default, read from its
    own parser so the two paths cannot drift apart."""
    from microbench.cli import build_parser
    from microbench.commands.common import settings_from_args

    settings = settings_from_args(build_parser().parse_args(["memory"]), check=False)
    return settings.warmup, settings.iters


@pytest.mark.parametrize("impl", ["native", "python"])
@pytest.mark.benchmark(group="memcpy 64M, 1 thread")
def test_memcpy_one_thread(probe_benchmark, monkeypatch, impl):
    if impl == "native" and not native.available():
        pytest.skip("native module not built")
    if impl == "python":
        monkeypatch.setattr(native, "_module", None)
    # The same copies `microbench memory --sizes 64M` times: MemoryProbe.run_once (native copies
    # in batches of copies_per_call, buffers allocated and touched once per batch, outside the
    # timed copies), with the command's warm-up and iteration counts, so the same copies of the
    # same batches are timed and the medians compare like for like.
    warmup, iters = memory_command_counts()
    probe = MemoryProbe(Config(sizes=[SIZE], gpu=False, copies_per_call=copies_per_call(warmup, iters)))
    info = probe_benchmark(probe, Case("memcpy_1t", SIZE), rounds=iters, warmup_rounds=warmup)
    info["copy_kernel"] = probe.kernels.get(("memcpy_1t", SIZE))  # saved with --benchmark-json
    assert info["copy_gbps"] > 0 and info["implementation"]["engine"].startswith("memcpy" if impl == "native" else "numpy")
    assert info["copy_kernel"] in (("libc", "stream") if impl == "native" else ("numpy",))


@pytest.mark.parametrize("impl", ["native", "python"])
@pytest.mark.benchmark(group="buffered write 16M x 4, fsync")
def test_buffered_write(benchmark, tmp_path, monkeypatch, impl):
    if impl == "native" and not native.available():
        pytest.skip("native module not built")
    if impl == "python":
        monkeypatch.setattr(native, "_module", None)
    path = tmp_path / "data.bin"
    path.write_bytes(b"\0" * (SIZE))
    out = benchmark.pedantic(native.io_run, args=(str(path),), kwargs=dict(write=True, bs=16 << 20, size=SIZE),
                             rounds=3, warmup_rounds=1)
    assert out["bytes"] == SIZE
