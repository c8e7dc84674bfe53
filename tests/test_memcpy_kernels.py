"""The memcpy ceiling's kernels: each copies correctly (the C side compares the buffers after
the timed copies and fails with EIO otherwise) and auto reports which one ran."""

from __future__ import annotations

import pytest

from microbench.targets import native

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
    from microbench.core.probe import Case
    from microbench.probes.memory import Config, MemoryProbe

    probe = MemoryProbe(Config(sizes=[4 << 20], gpu=False))
    case = Case("memcpy_1t", 4 << 20)
    probe.prepare(case)
    assert probe.run_once(case).time_s > 0
    assert probe.row_fields(case)["copy_kernel"] in ("libc", "stream")


def test_buffered_reads_are_judged_against_the_plain_copy():
    from microbench.core.probe import Case
    from microbench.probes.storage import posix as sp

    class Target:
        direct, memory_backed = False, False
        ceiling_gbps, plain_copy_gbps = 2.0, 1.0   # streaming stores twice as fast as memcpy

    probe = sp.PosixProbe(sp.Config(), Target())  # type: ignore[arg-type]
    case = Case("read", 1 << 20, (("tool", "posix"),))
    probe._bytes[case] = 1_000_000_000
    row = probe.metrics(case, 1.1)  # 0.91 GB/s: 45% of the fastest copy, 91% of the kernel's kind
    assert row["served_from_memory"] and "at least 80% of memcpy (1.00 GB/s)" in row["note"]
    assert not row["above_memory_ceiling"]


def test_memory_ceilings_take_the_fastest_and_the_plain_copy(monkeypatch):
    from microbench.probes.storage import posix as sp

    calls = []

    def fake_run(size, threads, iters, kernel="auto"):
        calls.append((threads, kernel))
        # auto picks streaming at 0.5 s; libc takes 1 s (1 thread) or 0.8 s (all cores)
        return ([0.5, 0.6], "stream") if kernel == "auto" else ([1.0 if threads == 1 else 0.8], "libc")

    monkeypatch.setattr(sp.native, "memcpy_run", fake_run)
    monkeypatch.setattr(sp.native, "available", lambda: True)
    monkeypatch.setattr(sp, "usable_cores", lambda: 2)
    fastest, plain = sp.memory_ceilings(1_000_000_000, 2)
    assert fastest == pytest.approx(2.0) and plain == pytest.approx(1.25)
    assert sorted(calls) == [(1, "auto"), (1, "libc"), (2, "auto"), (2, "libc")]


def test_memory_command_times_a_case_in_one_native_call(monkeypatch, tmp_path):
    """Each native call allocates, touches and checks its own buffers and picks a kernel, all
    untimed (~0.4 s at 256M): `microbench memory` asks for warm-up + iterations at once."""
    from microbench import cli
    from microbench.probes import memory as mem

    calls = []

    def fake_run(size, threads, iters, kernel="auto"):
        calls.append((size, threads, iters, kernel))
        return [0.001 * (i + 1) for i in range(iters)], "libc"

    monkeypatch.setattr(mem.native, "memcpy_run", fake_run)
    monkeypatch.chdir(tmp_path)
    assert cli.main(["memory", "--sizes", "4M", "--warmup", "2", "--iters", "10", "--threads", "2"]) == 0
    assert [(c[1], c[2]) for c in calls] == [(1, 12), (2, 12)]
    assert [c[3] for c in calls] == ["auto", "auto"]
