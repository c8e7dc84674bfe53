"""The record store: atomic, never overwriting, partial on failure; secrets never recorded."""

import json
import os
import stat

import pytest

from microbench.core.errors import Interrupted, RunError, UsageError
from microbench.core.probe import Case, Probe
from microbench.results import RecordWriter, load_record, new_record, write_csv
from microbench.results.schema import SCHEMA_VERSION, redact, redact_argv
from microbench.run.runner import SweepSettings, run_probe


def record(kind="demo", config=None):
    return new_record(kind, config or {"a": 1}, {"hostname": "h"}, {"name": "python"}, argv=["microbench", "demo"])


def test_writer_claims_a_new_file_and_rewrites_it_whole(tmp_path):
    writer = RecordWriter(record(), directory=tmp_path)
    assert json.loads(writer.path.read_text())["status"] == "running"
    writer.add_rows([{"op": "x", "size_bytes": 1}])
    writer.finish("complete")
    data = load_record(writer.path)
    assert data["schema_version"] == SCHEMA_VERSION and data["status"] == "complete"
    assert data["rows"] == [{"op": "x", "size_bytes": 1}] and data["ended_at"]
    assert stat.S_IMODE(os.stat(writer.path).st_mode) == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == [writer.path.name]  # no temp files left


def test_default_names_never_collide(tmp_path):
    paths = {RecordWriter(record(), directory=tmp_path).path for _ in range(3)}
    assert len(paths) == 3


def test_an_existing_file_is_never_overwritten(tmp_path):
    target = tmp_path / "run.json"
    target.write_text("precious")
    with pytest.raises(UsageError) as info:
        RecordWriter(record(), path=target)
    assert repr(str(target)) in str(info.value) and "never overwritten" in str(info.value)
    assert target.read_text() == "precious"
    csv_target = tmp_path / "rows.csv"
    csv_target.write_text("precious")
    with pytest.raises(UsageError, match="never overwritten"):
        write_csv(csv_target, [{"a": 1}])
    assert csv_target.read_text() == "precious"


def test_csv_flattens_nested_fields(tmp_path):
    path = write_csv(tmp_path / "r.csv", [{"op": "a", "time_us": {"p50": 1.5}, "per_rank": [1, 2]}, {"op": "b", "x": 3}])
    lines = path.read_text().splitlines()
    assert lines[0] == "op,time_us.p50,per_rank,x"
    assert lines[1] == 'a,1.5,"[1, 2]",'


def test_load_record_rejects_what_it_cannot_read(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"schema_version": 99}))
    with pytest.raises(UsageError, match="schema_version 99"):
        load_record(bad)
    bad.write_text("{not json")
    with pytest.raises(UsageError, match="is not JSON"):
        load_record(bad)


class FailingProbe(Probe):
    """Sweeps three sizes; the third one fails the way the test asks."""

    name = "failing"

    def __init__(self, failure):
        self.failure = failure

    def cases(self):
        return [Case("op", s) for s in (1, 2, 3)]

    def run_once(self, case):
        if case.size_bytes == 3:
            raise self.failure
        return None

    def metrics(self, case, time_s):
        return {"rate": case.size_bytes / time_s}


@pytest.mark.parametrize("failure, error, reason", [
    (RuntimeError("Connection reset by peer"), RunError, "RuntimeError during op 3B: Connection reset by peer"),
    (RunError("disk full"), RunError, "disk full"),
    (KeyboardInterrupt(), Interrupted, "interrupted during op 3B"),
])
def test_a_failed_sweep_keeps_finished_rows_as_partial(tmp_path, failure, error, reason):
    settings = SweepSettings(warmup=1, iters=2, budget_s_per_case=None, progress=False)
    with pytest.raises(error) as info:
        run_probe(FailingProbe(failure), settings, config={"x": 1}, results_dir=str(tmp_path))
    files = list(tmp_path.glob("*.json"))
    assert len(files) == 1 and str(files[0]) in str(info.value) and "(partial)" in str(info.value)
    data = load_record(files[0])
    assert data["status"] == "partial" and reason in data["status_reason"]
    assert [r["size_bytes"] for r in data["rows"]] == [1, 2]
    assert all(r["iters"] == 2 and r["warmup"] == 1 and r["rate"] > 0 for r in data["rows"])


def test_secrets_never_reach_a_record(tmp_path):
    config = {"endpoint": "http://s3", "secret_key": "SHHH", "nested": [{"Password": "pw", "bucket": "b"}],
              "aws_session_token": "tok"}
    rec = new_record("s3", config, {}, {}, argv=["microbench", "s3", "--secret-key", "SHHH", "--token=tok",
                                                 "--url", "s3://AKIA:SHHH@host/bucket"])
    writer = RecordWriter(rec, directory=tmp_path)
    text = writer.path.read_text()
    assert "SHHH" not in text and "tok" not in text.replace("token", "") and '"pw"' not in text
    assert rec["config"]["endpoint"] == "http://s3" and rec["config"]["nested"][0]["bucket"] == "b"
    assert rec["argv"] == ["microbench", "s3", "--secret-key", "<redacted>", "--token=<redacted>",
                           "--url", "s3://AKIA:<redacted>@host/bucket"]


def test_redaction_keeps_ordinary_values():
    assert redact({"a": [1, {"b": 2}], "tokens_per_step": 5, "max_tokens": 1}) == \
        {"a": [1, {"b": 2}], "tokens_per_step": 5, "max_tokens": 1}
    assert redact({"AWS_SECRET_ACCESS_KEY": "x", "api-key": "y", "session_token": "z"}) == \
        {"AWS_SECRET_ACCESS_KEY": "<redacted>", "api-key": "<redacted>", "session_token": "<redacted>"}
    assert redact_argv(["--sizes", "1M-4M", "http://host/x", "--tokens", "5"]) == \
        ["--sizes", "1M-4M", "http://host/x", "--tokens", "5"]


def test_no_check_records_nwrong_as_unknown_and_the_table_says_na(tmp_path):
    from microbench.probes.nccl.table import collective_table

    class Unchecked(Probe):
        name = "unchecked"

        def cases(self):
            return [Case("all_reduce", 1024, (("placement", "in"),))]

        def run_once(self, case):
            return None

        def check(self, case):
            raise AssertionError("--no-check must not run the check")

        def row_fields(self, case):
            return {"count": 256, "dtype": "float32", "redop": "sum", "root": -1}

        def metrics(self, case, time_s):
            return {"algbw_gbps": 1.0, "busbw_gbps": 1.0}

    settings = SweepSettings(warmup=0, iters=1, budget_s_per_case=None, check=False, progress=False)
    outcome = run_probe(Unchecked(), settings, config={}, results_dir=str(tmp_path))
    assert [r["nwrong"] for r in outcome.rows] == [None]
    line = collective_table("all_reduce", outcome.rows, None).splitlines()[-1]
    assert line.split()[-1] == "N/A" and line.split()[:5] == ["1024", "256", "float", "sum", "-1"]


class WriteThenRead(Probe):
    """A save whose output the load right after reads: the load's check counts for both."""

    name = "write_then_read"

    def __init__(self, wrong_in_load: int, fail_load: BaseException | None = None):
        self.wrong_in_load, self.fail_load, self.checked = wrong_in_load, fail_load, []

    def cases(self):
        return [Case("save", 8), Case("load", 8)]

    def run_once(self, case):
        if case.op == "load" and self.fail_load is not None:
            raise self.fail_load
        return None

    def checked_by(self, case):
        return "load" if case.op == "save" else None

    def check(self, case):
        self.checked.append(case.op)
        return self.wrong_in_load


def test_a_case_checked_by_the_next_takes_its_count_and_skips_its_own_check(tmp_path):
    settings = SweepSettings(warmup=0, iters=1, budget_s_per_case=None, progress=False)
    probe = WriteThenRead(wrong_in_load=3)
    outcome = run_probe(probe, settings, config={}, json_path=str(tmp_path / "r.json"))
    assert probe.checked == ["load"]
    on_disk = json.loads((tmp_path / "r.json").read_text())["rows"]
    for rows in (outcome.rows, on_disk):
        assert [(r["op"], r["nwrong"], r.get("checked_by")) for r in rows] == [("save", 3, "load"), ("load", 3, None)]


def test_a_case_whose_checker_never_ran_stays_unchecked(tmp_path):
    settings = SweepSettings(warmup=0, iters=1, budget_s_per_case=None, progress=False)
    with pytest.raises(Interrupted):
        run_probe(WriteThenRead(0, KeyboardInterrupt()), settings, config={}, json_path=str(tmp_path / "r.json"))
    record = json.loads((tmp_path / "r.json").read_text())
    assert record["status"] == "partial"
    assert [(r["op"], r["nwrong"], r["checked_by"]) for r in record["rows"]] == [("save", None, "load")]


def test_a_new_file_is_claimed_written_whole_and_never_overwritten(tmp_path):
    # hunt's heatmap once claimed its name and then wrote into it in place: a failed write left
    # a truncated PNG under the final name. The store's writer leaves nothing behind instead.
    from microbench.results.store import atomic_write_new

    target = tmp_path / "heat.png"
    atomic_write_new(target, b"\x89PNG data", "heatmap")
    assert target.read_bytes() == b"\x89PNG data"
    assert oct(stat.S_IMODE(os.stat(target).st_mode)) == "0o644"
    with pytest.raises(UsageError, match=r"heatmap '.*heat.png' exists; files are never overwritten"):
        atomic_write_new(target, b"other", "heatmap")
    assert target.read_bytes() == b"\x89PNG data"

    broken = tmp_path / "broken.png"
    with pytest.raises(TypeError):
        atomic_write_new(broken, object(), "heatmap")  # type: ignore[arg-type]
    assert not broken.exists() and os.listdir(tmp_path) == ["heat.png"]


def test_a_number_that_is_not_finite_is_written_as_null_and_the_record_reads_back(tmp_path):
    # A bound that is never reached (compose's breakeven bandwidth for a latency-bound step) is
    # inf in memory; the file has no infinity for the one JSON reader to refuse.
    writer = RecordWriter(record(), tmp_path / "r.json")
    writer.add_rows([{"op": "x", "size_bytes": 1, "breakeven_busbw_gbps": float("inf"),
                      "nested": {"values": [1.5, float("nan"), -float("inf")]}}])
    path = writer.finish("complete")
    assert "Infinity" not in path.read_text() and "NaN" not in path.read_text()
    row = load_record(path)["rows"][0]
    assert row["breakeven_busbw_gbps"] is None
    assert row["nested"]["values"] == [1.5, None, None]
