"""A record another process carried on and the launcher finished through `RecordWriter.resume`
(verify fsdp, verify job) keeps its rows when the command then ends with a verdict's exit (3
INCONCLUSIVE, 1 FAIL): the launcher's first writer, stale since the ranks wrote the file, used to
stay among the open writers, and cli.py's abandon_open rewrote the file from it: status partial,
no rows, while the error line said every row was in it."""

from __future__ import annotations

import json

from microbench.results import RecordWriter, new_record
from microbench.results.store import abandon_open


def test_a_resumed_and_finished_record_survives_the_abandon_of_open_writers(tmp_path):
    path = tmp_path / "verify.json"
    launcher = RecordWriter(new_record("demo", {"a": 1}, {"hostname": "h"}, {"name": "python"},
                                       argv=["microbench", "demo"]), path)
    on_disk = json.loads(path.read_text())          # what a rank 0 carries on with, in its own process
    on_disk["rows"].append({"x": 1})
    path.write_text(json.dumps(on_disk))
    resumed = RecordWriter.resume(path)
    resumed.finish("complete")
    abandon_open("3 configuration(s) inconclusive")  # what cli.py does when the verdict raises
    final = json.loads(path.read_text())
    assert final["status"] == "complete" and final["rows"] == [{"x": 1}]
    assert launcher.record["status"] == "running"    # the stale writer was left alone


def test_a_resumed_writer_still_open_is_marked_partial_with_its_rows(tmp_path):
    path = tmp_path / "verify.json"
    launcher = RecordWriter(new_record("demo", {"a": 1}, {"hostname": "h"}, {"name": "python"},
                                       argv=["microbench", "demo"]), path)
    on_disk = json.loads(path.read_text())
    on_disk["rows"].append({"x": 1})
    path.write_text(json.dumps(on_disk))
    resumed = RecordWriter.resume(path)
    abandon_open("interrupted")
    final = json.loads(path.read_text())
    assert final["status"] == "partial" and final["rows"] == [{"x": 1}] and resumed and launcher
