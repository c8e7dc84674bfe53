"""Record schema version 2: the row schema per kind checked on write and read, version 1 records
upgraded on read (and still read by plot, compare and compose), the skipped record, and the one
time_us rule over ranks."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from conftest import last_line
from microbench.core.errors import ProbeUnavailable, RunError, UsageError
from microbench.core.probe import Case, Probe
from microbench.results import RecordWriter, load_record, new_record
from microbench.results.schema import SCHEMA_VERSION, STATUSES, upgrade
from microbench.run.runner import SweepSettings, aggregate_ranks, run_probe
from microbench.core.stats import summarize_us

V1 = Path(__file__).parent / "data" / "v1"


def v1(name: str) -> dict:
    return json.loads((V1 / f"{name}.json").read_text())


# --------------------------------------------------------------------------- version 1 records


def test_upgrade_renames_v1_latency_columns_and_leaves_the_original_alone():
    old = v1("storage_posix")
    before = copy.deepcopy(old)
    new = upgrade(old)
    assert old == before
    assert new["schema_version"] == SCHEMA_VERSION == 2 and new["upgraded_from"] == 1
    for row_old, row_new in zip(old["rows"], new["rows"]):
        assert "lat_p50_us" in row_old and "lat_p50_us" not in row_new
        for stat in ("p50", "p99", "p999", "max"):
            assert row_new[f"lat_us_{stat}"] == row_old[f"lat_{stat}_us"]
        unrenamed = {k: v for k, v in row_old.items() if not k.startswith("lat_")}
        assert {k: row_new[k] for k in unrenamed} == unrenamed
    assert upgrade(new) is new  # already current


@pytest.mark.parametrize("name", ["memory", "nccl", "storage_posix"])
def test_every_v1_record_in_tests_data_loads_as_v2(name):
    loaded = load_record(V1 / f"{name}.json")
    assert loaded["schema_version"] == 2 and loaded["upgraded_from"] == 1
    assert len(loaded["rows"]) == len(v1(name)["rows"]) > 0


def test_plot_compare_and_compose_read_v1_records(cli, tmp_path):
    pytest.importorskip("matplotlib")
    nccl, posix = V1 / "nccl.json", V1 / "storage_posix.json"
    png = tmp_path / "v1.png"
    plotted = cli("plot", f"v1={nccl}", "--out", str(png))
    assert plotted.returncode == 0, plotted.stderr
    assert png.stat().st_size > 0

    # A v1 record against the same run written as v2: every case pairs up, nothing changed.
    as_v2 = tmp_path / "storage_posix_v2.json"
    upgraded = upgrade(v1("storage_posix"))
    del upgraded["upgraded_from"]
    as_v2.write_text(json.dumps(upgraded))
    compared = cli("compare", str(posix), str(as_v2))
    assert compared.returncode == 0, compared.stderr
    assert f"# compared {len(upgraded['rows'])} value(s)" in compared.stdout
    # An old suite directory against itself.
    same = cli("compare", str(V1), str(V1))
    assert same.returncode == 0, same.stderr
    every_row = sum(len(v1(p.stem)["rows"]) for p in V1.glob("*.json"))
    assert "# skipped" not in same.stdout and f"# compared {every_row} value(s)" in same.stdout

    composed = cli("compose", "--model", "llama-3.1-8b", "--ranks", "2", "--gpu", "h100", "--nccl", f"v1={nccl}",
                       "--storage", f"disk={posix}", "--json", str(tmp_path / "compose.json"))
    assert composed.returncode == 0, composed.stderr
    record = load_record(tmp_path / "compose.json")
    assert record["kind"] == "compose" and record["status"] == "complete"
    assert str(nccl) in json.dumps(record) and str(posix) in json.dumps(record)


# --------------------------------------------------------------------------- validation


def memory_record() -> dict:
    return new_record("memory", {"probe": {}}, {"hostname": "h"}, {"native": True}, argv=["microbench", "memory"])


def memory_row() -> dict:
    """A row as the runner writes it for `microbench memory`, every MemoryRow field present."""
    return {"probe": "memory", "op": "memcpy_1t", "size_bytes": 1 << 20, "threads": 1, "copy_kernel": "stream",
            "iters": 3, "warmup": 1,
            "time_us": {"p50": 50.0, "p95": 52.0, "p99": 53.0, "max": 53.5, "min": 47.0, "mean": 50.2, "n": 3},
            "slowest_rank": 0, "per_rank_time_us_p50": [50.0], "nwrong": None, "copy_gbps": 21.0}


SCHEMA = "'memory' rows follow microbench.probes.memory.MemoryRow"

# (what breaks the row, what the message says after "row N ")
ROW_PROBLEMS = [
    (lambda r: r.pop("op"), "has no 'op' (a string)"),
    (lambda r: r.pop("size_bytes"), "has no 'size_bytes' (an integer)"),
    (lambda r: r.update(size_bytes="1M"), "has 'size_bytes' = '1M' (a JSON string), expected an integer"),
    (lambda r: r.update(size_bytes=True), "has 'size_bytes' = True (a JSON boolean), expected an integer"),
    (lambda r: r.update(copy_gbps="fast"), "has 'copy_gbps' = 'fast' (a JSON string), expected a number"),
    (lambda r: r.update(threads="1"), "has 'threads' = '1' (a JSON string), expected an integer or null"),
    (lambda r: r["time_us"].update(p50="50"), "has 'time_us.p50' = '50' (a JSON string), expected a number"),
    (lambda r: r.update(time_us=[50.0]), "has 'time_us' = [50.0] (a JSON list), expected an object"),
    (lambda r: r.update(per_rank_time_us_p50=[50.0, "x"]),
     "has 'per_rank_time_us_p50' = [50.0, 'x'] (a JSON list), expected a list of numbers"),
]

# Fields a row from an earlier release of version 2 may lack (the reader takes it), but the runner
# must write (the writer refuses it as a bug).
RUNNER_ONLY = [
    (lambda r: r.pop("copy_gbps"), "has no 'copy_gbps' (a number)"),
    (lambda r: r["time_us"].pop("p99"), "has no 'time_us.p99' (a number)"),
]

ENVELOPE_PROBLEMS = [
    (lambda d: d.update(schema_version=3), "schema_version 3 is not supported (expected 1 or 2; a newer microbench "
                                          "wrote it?)"),
    (lambda d: d.pop("rows"), "record lacks 'rows'"),
    (lambda d: d.pop("kind"), "record lacks 'kind'"),
    (lambda d: d.update(status="failed"), f"status 'failed' is not one of {STATUSES}"),
    (lambda d: d.update(rows={"op": "x"}), "its rows are not a list of objects (they are a JSON object)"),
    (lambda d: d.update(rows=[memory_row(), 7]), "its rows are not a list of objects (row 1 is a JSON number)"),
]


def broken_row(breaks) -> dict:
    row = memory_row()
    breaks(row)
    return row


@pytest.mark.parametrize("breaks, message", ROW_PROBLEMS + RUNNER_ONLY)
def test_the_writer_refuses_a_row_that_breaks_its_schema_as_a_bug(tmp_path, breaks, message):
    writer = RecordWriter(memory_record(), directory=tmp_path)
    writer.add_rows([memory_row()], complete=True)
    with pytest.raises(RunError) as info:
        writer.add_rows([broken_row(breaks)], complete=True)
    text = str(info.value)
    assert text == (f"bug: the 'memory' record {str(writer.path)!r} would not be readable: "
                    f"row 1 {message}; {SCHEMA}")
    assert len(load_record(writer.path)["rows"]) == 1  # the file keeps what was valid


@pytest.mark.parametrize("breaks, message", ROW_PROBLEMS)
def test_a_hand_made_row_is_type_checked_on_write(tmp_path, breaks, message):
    writer = RecordWriter(memory_record(), directory=tmp_path)
    with pytest.raises(RunError, match="row 0 " + _re(message)):
        writer.add_rows([broken_row(breaks)])


@pytest.mark.parametrize("breaks, message", RUNNER_ONLY)
def test_a_reader_takes_a_row_without_a_field_added_since(tmp_path, breaks, message):
    record = memory_record()
    record.update(status="complete", rows=[broken_row(breaks)])
    path = tmp_path / "older.json"
    path.write_text(json.dumps(record))
    assert load_record(path)["rows"] == record["rows"]


@pytest.mark.parametrize("breaks, message", ENVELOPE_PROBLEMS)
def test_the_writer_refuses_a_broken_envelope_before_claiming_a_file(tmp_path, breaks, message):
    record = memory_record()
    breaks(record)
    with pytest.raises(RunError) as info:
        RecordWriter(record, directory=tmp_path)
    assert str(info.value) == f"bug: the {record.get('kind')!r} record would not be readable: {message}"
    assert list(tmp_path.iterdir()) == []


def _read_back(tmp_path, record):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(record))
    with pytest.raises(UsageError) as info:
        load_record(path)
    return path, str(info.value)


@pytest.mark.parametrize("breaks, message", ROW_PROBLEMS)
def test_a_reader_names_the_file_the_row_and_the_field(tmp_path, breaks, message):
    record = memory_record()
    record.update(status="complete", rows=[memory_row(), memory_row(), broken_row(breaks)])
    path, text = _read_back(tmp_path, record)
    assert text == f"results file {str(path)!r} is not a microbench record: row 2 {message}; {SCHEMA}"


@pytest.mark.parametrize("breaks, message", ENVELOPE_PROBLEMS)
def test_a_reader_names_the_file_and_what_the_envelope_lacks(tmp_path, breaks, message):
    record = memory_record()
    record.update(status="complete", rows=[memory_row()])
    breaks(record)
    path, text = _read_back(tmp_path, record)
    assert text == f"results file {str(path)!r} is not a microbench record: {message}"


def test_a_reader_refuses_what_is_not_a_record_object(tmp_path):
    path = tmp_path / "list.json"
    path.write_text("[1, 2]")
    with pytest.raises(UsageError) as info:
        load_record(path)
    assert str(info.value) == (f"results file {str(path)!r} is not a microbench record: it holds a JSON list, "
                               f"not an object with schema_version, kind and rows")


def test_a_bad_row_read_by_the_cli_is_one_line_naming_file_row_and_field(cli, tmp_path):
    record = v1("memory")
    record["rows"][1]["copy_gbps"] = "21 GB/s"
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(record))
    done = cli("plot", str(path), "--out", str(tmp_path / "x.png"))
    assert done.returncode == 2
    assert done.stderr.strip() == last_line(done.stderr) == (
        f"microbench: results file {str(path)!r} is not a microbench record: row 1 has 'copy_gbps' = '21 GB/s' "
        f"(a JSON string), expected a number; {SCHEMA}")


def test_the_writer_refuses_a_status_never_written(tmp_path):
    writer = RecordWriter(memory_record(), directory=tmp_path)
    with pytest.raises(RunError, match=r"bug: status 'failed' is not one of"):
        writer.finish("failed")


def _re(text: str) -> str:
    import re

    return re.escape(text)


# --------------------------------------------------------------------------- skipped probes


class Unavailable(Probe):
    name = "unavailable_demo"

    def __init__(self, where: str):
        self.where = where

    def unavailable_reason(self):
        return "needs a frobnicator, and none is here" if self.where == "reason" else None

    def cases(self):
        if self.where == "cases":
            raise ProbeUnavailable("the frobnicator library did not load")
        return [Case("op", 1)]

    def run_once(self, case):
        raise AssertionError("a skipped probe never runs a case")


@pytest.mark.parametrize("where, reason", [("reason", "needs a frobnicator, and none is here"),
                                           ("cases", "the frobnicator library did not load")])
def test_the_runner_writes_a_skipped_record(tmp_path, where, reason):
    settings = SweepSettings(warmup=1, iters=2, budget_s_per_case=None, progress=False)
    target = tmp_path / "skip.json"
    with pytest.raises(ProbeUnavailable, match=reason):
        run_probe(Unavailable(where), settings, config={"knob": 3}, json_path=str(target))
    record = load_record(target)
    assert (record["status"], record["status_reason"], record["rows"]) == ("skipped", reason, [])
    assert record["kind"] == "unavailable_demo" and record["config"]["probe"] == {"knob": 3}
    assert record["config"]["sweep"]["iters"] == 2 and record["ended_at"]


@pytest.mark.slow
def test_storage_gds_without_a_gpu_exits_0_with_a_skipped_record(run_cli, tmp_path):
    from microbench.probes.storage import gds as storage_gds

    why = storage_gds.unavailable_reason()
    if why is None:
        pytest.skip("GDS can run here; the skip path is not reachable")
    done = run_cli("storage", "gds", "--path", str(tmp_path / "g"), "--size", "64M", "--json", "x.json")
    assert done.returncode == 0
    assert done.stderr.strip() == f"microbench: skipped: storage gds: {why}"
    record = load_record(tmp_path / "x.json")
    assert record["status"] == "skipped" and record["status_reason"] == f"storage gds: {why}"
    assert record["kind"] == "storage_gds" and record["rows"] == []
    assert record["config"]["probe"]["sizes"] == [64 << 20]
    assert not (tmp_path / "g").exists()  # skipped before the run directory is made


# --------------------------------------------------------------------------- time_us over ranks


def test_time_us_is_the_max_over_ranks_of_each_statistic():
    # Rank 0 has one long stall; rank 1 is steady but slower in the middle.
    rank0 = [0.001, 0.002, 0.003, 0.004, 0.100]
    rank1 = [0.005, 0.005, 0.005, 0.005, 0.005]
    stats, slowest, medians = aggregate_ranks([rank0, rank1])
    assert stats["p50"] == pytest.approx(5000)     # rank 1's median
    assert stats["min"] == pytest.approx(5000)     # rank 1's minimum, above rank 0's 1000
    assert stats["max"] == pytest.approx(100000)   # rank 0's stall
    assert stats["mean"] == pytest.approx(22000)   # rank 0's mean, (1+2+3+4+100)/5 ms
    mine = [summarize_us(rank0), summarize_us(rank1)]
    for key in ("p50", "p95", "p99", "max", "min", "mean", "n"):
        assert stats[key] == max(m[key] for m in mine)
    assert stats["min"] <= stats["p50"] <= stats["p95"] <= stats["p99"] <= stats["max"]
    assert slowest == 1 and medians == pytest.approx([3000, 5000])


def test_one_rank_is_its_own_summary():
    times = [0.002, 0.001, 0.004]
    stats, slowest, medians = aggregate_ranks([times])
    assert stats == summarize_us(times) and slowest == 0 and medians == [stats["p50"]]
