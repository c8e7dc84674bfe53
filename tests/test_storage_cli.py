"""`microbench storage posix|fio` end to end, and every fault the issue names: one line on
stderr, exit 1 or 2, nothing left under --path."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import last_line

HAS_FIO = shutil.which("fio") is not None
SMALL = ["--size", "8M", "--bs", "1M", "--warmup", "0", "--iters", "2", "--progress", "off"]


def _leftovers(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir())


@contextlib.contextmanager
def mounted(where: Path, fstype: str, options: str):
    """A small filesystem of our own, unmounted afterwards; skips where mounting isn't allowed."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a small filesystem")
    where.mkdir()
    out = subprocess.run(["mount", "-t", fstype, "-o", options, fstype, str(where)], capture_output=True, text=True)
    if out.returncode != 0:
        where.rmdir()
        pytest.skip(f"cannot mount {fstype} here: {out.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)
        where.rmdir()


def _record(tmp_path: Path, name: str = "out.json") -> dict:
    return json.loads((tmp_path / name).read_text())


@pytest.mark.slow
def test_posix_writes_reads_and_cleans_up_without_fio(run_cli, tmp_path):
    target, bare = tmp_path / "target", tmp_path / "bin"
    target.mkdir()
    bare.mkdir()
    # No fio on PATH: --compare-fio says so and the native engine still runs.
    out = run_cli("storage", "posix", "--path", str(target), "--rw", "write,read", "--json", "out.json",
                  "--compare-fio", *SMALL, env={"PATH": str(bare)})
    assert out.returncode == 0, out.stderr
    assert "# --compare-fio skipped: fio is not installed" in out.stdout
    assert "posix" in out.stdout and "p99 us" in out.stdout
    rec = _record(tmp_path)
    assert rec["status"] == "complete" and rec["kind"] == "storage_posix"
    impl = rec["implementation"]
    assert impl["filesystem"] and impl["direct_in_effect"] in (True, False) and impl["memory_ceiling_gbps"] > 0
    assert [(r["op"], r["tool"], r.get("stream")) for r in rec["rows"]] == [
        ("write", "posix", None), ("read", "posix", None), ("write", "posix", "single")]
    for row in rec["rows"]:
        assert row[f"{row['op']}_gbps"] > 0 and row["total_bytes"] == 8 << 20
        assert row["lat_us_p50"] <= row["lat_us_p99"] <= row["lat_us_p999"]
    assert _leftovers(target) == []
    out = run_cli("storage", "fio", "--path", str(target), *SMALL, env={"PATH": str(bare)})
    assert out.returncode == 0
    assert last_line(out.stderr).startswith("microbench: skipped: fio is not installed")
    assert _leftovers(target) == []


@pytest.mark.slow
def test_keep_and_python_fallback(run_cli, tmp_path):
    out = run_cli("storage", "posix", "--path", str(tmp_path), "--rw", "read", "--pattern", "rand", "--keep",
                  "--json", "out.json", *SMALL, env={"MICROBENCH_NO_NATIVE": "1"})
    assert out.returncode == 0, out.stderr
    kept = [p for p in tmp_path.iterdir() if p.name.startswith("microbench-storage-")]
    assert len(kept) == 1 and (kept[0] / "data.bin").stat().st_size == 8 << 20
    assert f"# kept {kept[0]}" in out.stdout
    rec = _record(tmp_path)
    assert rec["implementation"]["name"] == "python" and rec["rows"][0]["engine"] == "python threads"


@pytest.mark.slow
@pytest.mark.skipif(not HAS_FIO, reason="fio not installed")
def test_compare_fio_prints_ratio_and_records_both(run_cli, tmp_path):
    out = run_cli("storage", "posix", "--path", str(tmp_path), "--rw", "read", "--compare-fio", "--json", "out.json",
                  *SMALL)
    assert out.returncode == 0, out.stderr
    assert "posix/fio" in out.stdout and "fio GB/s" in out.stdout
    rec = _record(tmp_path)
    assert sorted(r["tool"] for r in rec["rows"]) == ["fio", "posix"]
    ratio = rec["summary"]["vs_fio"][0]
    assert ratio["ratio_posix_over_fio"] == pytest.approx(ratio["posix_gbps"] / ratio["fio_gbps"])
    assert rec["implementation"]["fio_version"].startswith("fio")


@pytest.mark.slow
@pytest.mark.skipif(not HAS_FIO, reason="fio not installed")
def test_fio_subcommand_same_record_format(run_cli, tmp_path):
    out = run_cli("storage", "fio", "--path", str(tmp_path), "--rw", "write", "--json", "out.json", *SMALL)
    assert out.returncode == 0, out.stderr
    row = _record(tmp_path)["rows"][0]
    assert row["tool"] == "fio" and row["write_gbps"] > 0 and row["engine"].startswith("fio ")
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("microbench-")] == []


@pytest.mark.parametrize("args,code,message", [
    (["--bs", "0"], 2, "invalid --bs '0': must be greater than zero"),
    (["--bs", "3K", "--direct"], 2, "invalid --bs '3K': with O_DIRECT the block size must be a multiple of 4K"),
    (["--bs", "3K"], 2, "invalid --bs '3K': with O_DIRECT"),
    (["--rw", "append"], 2, "invalid --rw 'append'"),
    (["--pattern", "zigzag"], 2, "invalid --pattern 'zigzag'"),
    (["--threads", "0"], 2, "invalid --threads '0'"),
    (["--size", "1M", "--bs", "1M", "--qd", "4"], 2, "--size 1M is too small"),
])
def test_bad_input_one_line_and_nothing_written(cli, tmp_path, args, code, message):
    target = tmp_path / "target"
    target.mkdir()
    out = cli("storage", "posix", "--path", str(target), *[a for a in SMALL if a not in ("--bs", "1M")], *args)
    assert out.returncode == code
    assert len(out.stderr.strip().splitlines()) == 1 and message in out.stderr, out.stderr
    assert _leftovers(target) == []


def test_missing_path_is_usage_error(cli, tmp_path):
    out = cli("storage", "posix", "--path", str(tmp_path / "nope"), *SMALL)
    assert out.returncode == 2 and "does not exist" in last_line(out.stderr)


def test_read_only_path(cli, tmp_path):
    with mounted(tmp_path / "ro", "tmpfs", "ro,size=16m") as ro:
        out = cli("storage", "posix", "--path", str(ro), *SMALL)
        assert out.returncode == 2   # found before any work: misuse of the place, as in every probe
        assert len(out.stderr.strip().splitlines()) == 1
        assert f"--path {str(ro)!r}: directory {str(ro)!r} is on a read-only filesystem" in out.stderr
        assert _leftovers(ro) == []


def test_refuses_when_free_space_is_short(cli, tmp_path):
    with mounted(tmp_path / "small", "tmpfs", "size=4m") as small:
        out = cli("storage", "posix", "--path", str(small), *SMALL)
        assert out.returncode == 2   # found before any work, as checkpoint, dataload and modelload find it
        line = last_line(out.stderr)
        assert "not enough free space" in line and "needs 9.0 MiB" in line and "only 4.0 MiB is free" in line
        assert _leftovers(small) == []


@pytest.mark.slow
@pytest.mark.parametrize("native_off", ["0", "1"])
def test_enospc_mid_write(run_cli, tmp_path, native_off):
    with mounted(tmp_path / "full", "tmpfs", "size=4m") as full:
        out = run_cli("storage", "posix", "--path", str(full), "--no-space-check", *SMALL,
                      env={"MICROBENCH_NO_NATIVE": native_off})
        assert out.returncode == 1
        assert len(out.stderr.strip().splitlines()) == 1 and "no space left on device (ENOSPC)" in out.stderr
        assert "Traceback" not in out.stderr
        assert _leftovers(full) == []


@pytest.mark.slow
def test_filesystem_without_o_direct(run_cli, tmp_path):
    # ramfs refuses O_DIRECT and reports no free space, so --no-space-check as on FUSE mounts.
    with mounted(tmp_path / "ram", "ramfs", "size=64m") as ram:
        out = run_cli("storage", "posix", "--path", str(ram), "--direct", "--no-space-check", *SMALL)
        assert out.returncode == 2 and "refuses O_DIRECT" in last_line(out.stderr)
        assert _leftovers(ram) == []
        out = run_cli("storage", "posix", "--path", str(ram), "--no-space-check", "--rw", "read", "--json",
                      "out.json", *SMALL)
        assert out.returncode == 0, out.stderr
        assert "# O_DIRECT not in effect: ramfs" in out.stdout and "(memory!)" in out.stdout
        assert "memory-backed filesystem" in out.stdout
        rec = _record(tmp_path)
        assert rec["rows"][0]["served_from_memory"] is True
        impl = rec["implementation"]
        assert impl["direct_in_effect"] is False and impl["filesystem"] == "ramfs"
        assert _leftovers(ram) == []


@pytest.mark.slow
def test_sigterm_mid_run_removes_the_test_directory(tmp_path):
    import signal
    import sys
    import time

    from conftest import cli_env

    target = tmp_path / "target"
    target.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "microbench", "storage", "posix", "--path", str(target), "--size",
                             "8M", "--bs", "1M", "--rw", "write", "--warmup", "0", "--iters", "100000", "--budget", "0"],
                            cwd=tmp_path, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not list(target.glob("microbench-storage-*/data.bin")) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1
    assert len(err.strip().splitlines()) == 1 and "interrupted" in err
    assert _leftovers(target) == []
