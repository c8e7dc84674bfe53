"""A disk that fills or a mount that is read-only while a command writes its outputs: exit 1, one
stderr line naming the file and the cause, and no empty or half-written file where a complete
record was promised (a record that was partly written says partial). The store, the CSV writer
and the command line do it once for every command."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pytest

from conftest import one_error_line, tmpfs
from microbench.core.errors import RunError
from microbench.results import RecordWriter, new_record, write_csv
from microbench.results.store import abandon_open, atomic_write_new

GPU = ["--gpu", "h100", "--nodes", "1", "--gpus-per-node", "2"]
MEMORY = ["memory", "--sizes", "64K", "--threads", "1", "--warmup", "0", "--iters", "2"]


def _fill(path: Path, leave_bytes: int = 0) -> None:
    """Leave about `leave_bytes` free on the filesystem holding `path`."""
    st = os.statvfs(path)
    free = st.f_bavail * st.f_frsize
    (path / "filler").write_bytes(b"\0" * max(0, free - leave_bytes))


@pytest.fixture
def full_dir(tmp_path):
    """A full 8 MiB tmpfs."""
    with tmpfs(tmp_path / f"full-{uuid.uuid4().hex[:6]}", "size=8m") as mnt:
        _fill(mnt)
        yield mnt


def _failed(done, *fragments):
    assert done.returncode == 1, done.stdout + done.stderr
    line = one_error_line(done.stderr)
    for fragment in fragments:
        assert fragment in line, line
    return line


# --------------------------------------------------------------------------- unit: the store


class _Refusing:
    """os.replace that refuses with ENOSPC, except for the calls numbered in `allowed` (0 the
    first): the disk full for some writes and not for others."""

    def __init__(self, *allowed: int):
        self.allowed, self.calls = allowed, 0

    def __call__(self, src, dst):
        self.calls += 1
        if self.calls - 1 not in self.allowed:
            raise OSError(28, "No space left on device")
        return os.rename(src, dst)


def _record():
    return new_record("memory", {"probe": {}}, {}, {})


def test_a_record_never_written_is_removed(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "replace", _Refusing())
    with pytest.raises(RunError) as info:
        RecordWriter(_record(), tmp_path / "r.json")
    assert str(info.value) == f"cannot write results file {str(tmp_path / 'r.json')!r}: No space left on device"
    assert list(tmp_path.iterdir()) == []


def test_a_results_dir_made_for_a_record_never_written_goes_too(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "replace", _Refusing())
    with pytest.raises(RunError):
        RecordWriter(_record(), directory=tmp_path / "a" / "b")
    assert list(tmp_path.iterdir()) == []


def test_a_record_that_cannot_grow_keeps_its_rows_as_partial(tmp_path, monkeypatch):
    writer = RecordWriter(_record(), tmp_path / "r.json")
    writer.add_rows([{"probe": "memory", "op": "a", "size_bytes": 1}])
    monkeypatch.setattr(os, "replace", _Refusing(1))   # room for the partial copy only, not the longer record
    with pytest.raises(RunError, match="No space left on device"):
        writer.add_rows([{"probe": "memory", "op": "b", "size_bytes": 2}])
    on_disk = json.loads((tmp_path / "r.json").read_text())
    assert on_disk["status"] == "partial" and len(on_disk["rows"]) == 1 and writer.saved_rows == 1
    assert "No space left on device" in on_disk["status_reason"]
    assert writer.finish("complete") == tmp_path / "r.json"   # nothing more is written
    assert json.loads((tmp_path / "r.json").read_text())["status"] == "partial"


def test_with_no_room_for_a_copy_the_status_is_patched_in_place(tmp_path, monkeypatch):
    writer = RecordWriter(_record(), tmp_path / "r.json")
    writer.add_rows([{"probe": "memory", "op": "a", "size_bytes": 1}])
    monkeypatch.setattr(os, "replace", _Refusing())
    with pytest.raises(RunError):
        writer.add_rows([{"probe": "memory", "op": "b", "size_bytes": 2}])
    on_disk = json.loads((tmp_path / "r.json").read_text())
    assert on_disk["status"] == "partial" and len(on_disk["rows"]) == 1
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]   # no temp file left


def test_a_record_left_running_is_marked_partial_by_abandon_open(tmp_path):
    writer = RecordWriter(_record(), tmp_path / "r.json")
    abandon_open("stdout closed by its reader")
    on_disk = json.loads(writer.path.read_text())
    assert on_disk["status"] == "partial" and on_disk["status_reason"] == "stdout closed by its reader"


def test_a_csv_is_whole_or_absent(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "replace", _Refusing())
    with pytest.raises(RunError) as info:
        write_csv(tmp_path / "r.csv", [{"a": 1}])
    assert str(info.value) == f"cannot write CSV file {str(tmp_path / 'r.csv')!r}: No space left on device"
    with pytest.raises(RunError, match="cannot write heatmap"):
        atomic_write_new(tmp_path / "h.png", b"png", "heatmap")
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------- the commands, on a full tmpfs


@pytest.mark.slow
@pytest.mark.root
@pytest.mark.parametrize("argv,flag,name", [
    (MEMORY, "--json", "m.json"),
    (["compose", "--model", "llama-3.1-8b", "--net", "ib=40GB/s", *GPU], "--json", "c.json"),
])
def test_json_on_a_full_disk_exit_1_and_no_file(run_cli, full_dir, argv, flag, name):
    done = run_cli(*argv, flag, str(full_dir / name), timeout=120)
    _failed(done, f"cannot write results file {str(full_dir / name)!r}: No space left on device")
    assert sorted(p.name for p in full_dir.iterdir()) == ["filler"]


@pytest.mark.slow
@pytest.mark.root
@pytest.mark.parametrize("argv", [MEMORY, ["compose", "--model", "llama-3.1-8b", "--net", "ib=40GB/s", *GPU]],
                         ids=["memory", "compose"])
def test_results_dir_on_a_full_disk_exit_1_and_nothing_left(run_cli, full_dir, argv):
    done = run_cli(*argv, "--results-dir", str(full_dir / "res"), timeout=120)
    _failed(done, f"cannot write results file '{full_dir / 'res'}/", "No space left on device")
    assert sorted(p.name for p in full_dir.iterdir()) == ["filler"]


@pytest.mark.root
@pytest.mark.slow
def test_nccl_json_and_csv_on_a_full_disk(run_cli, full_dir, tmp_path):
    nccl = ["nccl", "--sizes", "64K", "--nproc", "2", "--ops", "all_reduce", "--warmup", "0", "--iters", "2"]
    done = run_cli(*nccl, "--json", str(full_dir / "nf.json"), timeout=120)
    _failed(done, f"cannot write results file {str(full_dir / 'nf.json')!r}: No space left on device")
    done = run_cli(*nccl, "--json", str(tmp_path / "ok.json"), "--csv", str(full_dir / "x.csv"), timeout=120)
    _failed(done, f"cannot write CSV file {str(full_dir / 'x.csv')!r}: No space left on device")
    assert sorted(p.name for p in full_dir.iterdir()) == ["filler"]
    assert json.loads((tmp_path / "ok.json").read_text())["status"] == "complete"


@pytest.mark.root
@pytest.mark.slow
def test_nccl_record_that_fills_the_disk_mid_sweep_is_partial_never_running(run_cli, tmp_path):
    # Room for the first versions of the record but not for a rewrite of it with more rows.
    with tmpfs(tmp_path / f"small-{uuid.uuid4().hex[:6]}", "size=8m") as mnt:
        _fill(mnt, 12 << 10)
        done = run_cli("nccl", "--sizes", "64K-8M", "--nproc", "2", "--ops", "all_reduce", "--warmup", "0",
                       "--iters", "2", "--json", str(mnt / "nf.json"), timeout=120)
        line = _failed(done, f"cannot write results file {str(mnt / 'nf.json')!r}: No space left on device")
        record = json.loads((mnt / "nf.json").read_text())
        leftovers = sorted(p.name for p in mnt.iterdir())
    assert record["status"] == "partial" and f"kept {len(record['rows'])} finished case(s)" in line
    assert len(record["rows"]) < 8   # how many fitted depends on the environment block's size
    assert leftovers == ["filler", "nf.json"]


@pytest.mark.root
def test_verify_job_dir_on_a_read_only_mount_is_refused_before_any_work(cli, tmp_path, read_only_dir):
    # Known before the job runs: exit 2, one line naming the directory and why, nothing written.
    done = cli("verify", "job", "--model", "tiny", "--steps", "2", "--ckpt-every", "1", "--dir",
                   str(read_only_dir), timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    line = one_error_line(done.stderr)
    assert f"--dir '{read_only_dir}'" in line and "read-only" in line, line
    assert not (tmp_path / "results").exists() or not list((tmp_path / "results").iterdir())
    assert not list(read_only_dir.iterdir())
