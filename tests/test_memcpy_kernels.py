"""The memcpy ceiling's kernels: each copies correctly (the C side compares the buffers after
the timed copies and fails with EIO otherwise) and auto reports which one ran."""

from __future__ import annotations

import pytest

from microbench import native

pytestmark = pytest.mark.skipif(not native.available(), reason="native module not built")


@pytest.mark.parametrize("kernel", ["libc", "stream", "auto"])
@pytest.mark.parametrize("size,threads", [(4 << 20, 1), (4 << 20, 2), ((1 << 20) + 13, 3)])
def test_kernels_copy_and_report(kernel, size, threads):
    times, used = native.memcpy_run(size, threads, 2, kernel)
    assert len(times) == 2 and all(t > 0 for t in times)
    assert used == kernel if kernel != "auto" else used in ("libc", "stream")


def test_unknown_kernel_is_refused():
    with pytest.raises(ValueError, match="kernel"):
        native.module().memcpy_bandwidth(1 << 20, 1, 1, "fast")


def test_memory_probe_records_the_kernel():
    from microbench.probe import Case
    from microbench.probes.memory import Config, MemoryProbe

    probe = MemoryProbe(Config(sizes=[4 << 20], gpu=False))
    case = Case("memcpy_1t", 4 << 20)
    probe.prepare(case)
    assert probe.run_once(case).time_s > 0
    assert probe.row_fields(case)["copy_kernel"] in ("libc", "stream")
