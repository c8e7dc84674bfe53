"""pytest-benchmark comparisons of microbench's hot paths, native core vs Python fallback.

    pytest benchmarks/test_hot_paths.py --benchmark-autosave        # save this machine's run
    pytest benchmarks/test_hot_paths.py --benchmark-compare         # compare with the last saved run

Each group holds the native and the fallback implementation of one path side by side. Read
the median: the mean of a handful of rounds on a shared machine is one preempted round away
from 1.5x (benchmarks/memcpy_ceiling.py compares this with `microbench memory`).
"""

import pytest

from microbench import native
from microbench.probe import Case
from microbench.probes.memory import Config, MemoryProbe

SIZE = 64 << 20


@pytest.mark.parametrize("impl", ["native", "python"])
@pytest.mark.benchmark(group="memcpy 64M, 1 thread")
def test_memcpy_one_thread(probe_benchmark, monkeypatch, impl):
    if impl == "native" and not native.available():
        pytest.skip("native module not built")
    if impl == "python":
        monkeypatch.setattr(native, "_module", None)
    # 15 rounds: two of the probe's batches of 8 copies, each batch allocating and touching its
    # buffers once, outside the timed copies, exactly as `microbench memory` runs them.
    info = probe_benchmark(MemoryProbe(Config(sizes=[SIZE], gpu=False)), Case("memcpy_1t", SIZE), rounds=15)
    assert info["copy_gbps"] > 0 and info["implementation"]["engine"].startswith("memcpy" if impl == "native" else "numpy")


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
