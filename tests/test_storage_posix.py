"""The storage posix/fio probes: engine, parsing, safety and the CLI on real files."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from conftest import refused as _refused

from microbench.core.errors import RunError, UsageError
from microbench.probes.storage import fio_engine as sf
from microbench.probes.storage import posix as sp
from microbench.targets import fallback as io_fallback
from microbench.targets import native
from microbench.targets.workdir import IOFailure, WorkDir, mount_of

MiB = 1 << 20
HAS_FIO = shutil.which("fio") is not None


def _file(tmp_path: Path, name: str = "f.bin") -> str:
    path = tmp_path / name
    path.touch()
    return str(path)


ENGINES = [pytest.param("native", marks=pytest.mark.skipif(not native.available(), reason="native core not built")),
           "python"]


def _io(engine: str, *args, **kw):
    if engine == "native":
        return native.io_run(*args, **kw)
    kw.pop("engine", None)
    return io_fallback.io_run(*args, **kw)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("qd,pattern", [(1, "seq"), (4, "rand")])
def test_engine_writes_then_reads_every_byte(tmp_path, engine, qd, pattern):
    path = _file(tmp_path)
    size = 8 * MiB
    w = _io(engine, path, True, 256 << 10, size, threads=2, qd=qd, direct=True, random_order=pattern == "rand")
    assert os.path.getsize(path) == size
    r = _io(engine, path, False, 256 << 10, size, threads=2, qd=qd, direct=True, random_order=pattern == "rand")
    for res in (w, r):
        assert res["bytes"] == size and res["ios"] == size // (256 << 10)
        assert res["seconds"] > 0 and res["iops"] > 0
        assert 0 < res["lat_p50_us"] <= res["lat_p99_us"] <= res["lat_p999_us"] <= res["lat_max_us"] * 1.0001
    with open(path, "rb") as handle:
        data = handle.read()
    assert data.count(0) < len(data) // 16  # incompressible payload, not zeros or holes


@pytest.mark.skipif(not native.available(), reason="native core not built")
def test_native_engine_names_its_engine_and_errno(tmp_path):
    path = _file(tmp_path)
    res = native.io_run(path, True, MiB, 4 * MiB, threads=1, qd=4, engine="io_uring" if native.io_uring_available() else "threads")
    assert res["engine"] == ("io_uring" if native.io_uring_available() else "pthreads")
    assert native.io_run(path, True, MiB, 4 * MiB, qd=4, engine="threads")["workers"] == 4
    with pytest.raises(OSError) as info:
        native.io_run(str(tmp_path / "missing.bin"), False, MiB, 4 * MiB)
    assert info.value.errno == 2


def test_parse_fio_json_skips_warnings_and_trailing_text():
    doc = {"fio version": "fio-3.33", "jobs": [{"jobname": "x"}]}
    text = "fio: this platform does not support process shared mutexes\n{ bogus\n" + json.dumps(doc) + "\ntrailer\n"
    assert sf.parse_fio_json(text) == doc
    with pytest.raises(RunError, match="no JSON"):
        sf.parse_fio_json("fio: failed to open file\n")


def _fio_doc(write: bool, error: int = 0) -> dict:
    side = {"io_bytes": 64 * MiB, "bw_bytes": 128 * MiB, "iops": 128.0,
            "lat_ns": {"max": 9_000_000, "percentile": {"50.000000": 1_000_000, "99.000000": 4_000_000,
                                                         "99.900000": 8_000_000}}}
    empty = {"io_bytes": 0, "bw_bytes": 0, "iops": 0.0, "lat_ns": {}}
    job = {"error": error, "job options": {"ioengine": "io_uring"},
           "write": side if write else empty, "read": empty if write else side}
    return {"jobs": [job]}


def test_summarize_fio_reads_the_right_direction_and_percentiles():
    res = sf.summarize_fio(_fio_doc(write=True), write=True)
    assert res["bytes"] == 64 * MiB and res["seconds"] == pytest.approx(0.5)
    assert (res["lat_p50_us"], res["lat_p99_us"], res["lat_p999_us"]) == (1000, 4000, 8000)
    assert res["engine"] == "fio io_uring"
    with pytest.raises(RunError, match="moved no bytes"):
        sf.summarize_fio(_fio_doc(write=True), write=False)
    with pytest.raises(RunError, match="error 28"):
        sf.summarize_fio(_fio_doc(write=True, error=28), write=True)


def test_fio_args_match_the_native_workload():
    uring = sf.fio_args("/d/f", write=True, bs=MiB, size=64 * MiB, threads=2, qd=8, direct=True,
                        random_order=False, engine="io_uring")
    assert {"--numjobs=2", "--iodepth=8", "--ioengine=io_uring", f"--size={32 * MiB}", f"--offset_increment={32 * MiB}",
            "--direct=1", "--rw=write", "--end_fsync=1", "--allow_file_create=0"} <= set(uring)
    sync = sf.fio_args("/d/f", write=False, bs=MiB, size=64 * MiB, threads=2, qd=4, direct=False,
                       random_order=True, engine="pthreads")
    assert {"--numjobs=8", "--iodepth=1", "--ioengine=psync", "--rw=randread", "--direct=0"} <= set(sync)
    assert not any(a.startswith("--end_fsync") for a in sync)


def test_validate_rejects_misaligned_direct_and_tiny_files(tmp_path):
    with pytest.raises(UsageError, match=r"invalid --bs '3K': with O_DIRECT .* multiple of 4K"):
        sp.validate(sp.Config(path=str(tmp_path), bs=[3 << 10], size=8 * MiB))
    sp.validate(sp.Config(path=str(tmp_path), bs=[3 << 10], size=8 * MiB, direct=False))
    with pytest.raises(UsageError, match="too small for --bs 16M"):
        sp.validate(sp.Config(path=str(tmp_path), bs=[16 * MiB], size=16 * MiB, qd=4))


def test_workdir_never_overwrites_and_removes_only_its_own(tmp_path):
    work = WorkDir(str(tmp_path), prefix="mb-")
    other = WorkDir(str(tmp_path), prefix="mb-")
    assert work.path != other.path and work.path.parent == tmp_path
    mine = work.new_file("data.bin")
    with pytest.raises(FileExistsError):
        work.new_file("data.bin")
    (work.path / "foreign.txt").write_text("not ours")
    work.cleanup()
    assert not mine.exists() and (work.path / "foreign.txt").exists()
    other.cleanup()
    assert not other.path.exists()


def test_mount_of_and_errno_messages():
    assert mount_of("/proc/self")["fstype"] == "proc"
    assert "no space left" in str(IOFailure("writing").error(OSError(28, "No space left on device")))
    assert isinstance(IOFailure("reading").error(OSError(22, "Invalid argument")), UsageError)
    assert "writable --path" in str(IOFailure("writing").error(OSError(30, "Read-only file system")))


class _FakeTarget:
    direct = True
    memory_backed = False
    ceiling_gbps = 1.0


def test_results_served_from_memory_are_flagged_not_reported_as_disk():
    from microbench.core.probe import Case

    target = _FakeTarget()
    probe = sp.PosixProbe(sp.Config(), target)  # type: ignore[arg-type]
    case = Case("read", MiB, (("tool", "posix"),))
    probe._bytes[case] = 1_000_000_000
    fast = probe.metrics(case, 0.5)
    assert fast["above_memory_ceiling"] and fast["served_from_memory"] and "above memcpy" in fast["note"]
    near = probe.metrics(case, 1.1)  # O_DIRECT at 0.9x memcpy: believable
    assert not near["served_from_memory"] and near["note"] is None
    target.direct = False  # buffered at 0.9x memcpy: the page cache
    assert "at least 80% of memcpy" in probe.metrics(case, 1.1)["note"]
    slow = probe.metrics(case, 2.0)
    assert slow["read_gbps"] == pytest.approx(0.5) and not slow["served_from_memory"]
    target.memory_backed = True
    assert probe.metrics(case, 2.0)["note"].startswith("memory-backed filesystem")
    rows = [{"op": "read", "size_bytes": MiB, "tool": "posix", "read_gbps": 0.9},
            {"op": "read", "size_bytes": MiB, "tool": "fio", "read_gbps": 1.0}]
    assert probe.summarize(rows)["vs_fio"][0]["ratio_posix_over_fio"] == pytest.approx(0.9)


def test_a_queue_depth_the_engine_cannot_take_is_refused_with_the_limit(cli, tmp_path):
    (tmp_path / "st").mkdir()
    line = _refused(cli("storage", "posix", "--path", "st", "--bs", "4K", "--qd", "60000", timeout=120),
                    "invalid --qd 60000: the native engine takes at most 32768 I/Os in flight per worker")
    assert "alignment" not in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["st"] and not any((tmp_path / "st").iterdir())
