"""The one check every file output goes through before anything is measured."""

from __future__ import annotations

import pytest

from microbench.core.errors import UsageError
from microbench.results.outputs import check_new_file


def _refused(*args, **kwargs) -> str:
    with pytest.raises(UsageError) as info:
        check_new_file(*args, **kwargs)
    return str(info.value)


def test_a_new_name_in_an_existing_directory_is_fine(tmp_path):
    assert check_new_file(tmp_path / "r.csv", "--csv") == tmp_path / "r.csv"


def test_an_existing_file_is_never_overwritten(tmp_path):
    old = tmp_path / "old.csv"
    old.write_text("keep me\n")
    assert _refused(str(old), "--csv", noun="CSV file", kept="results") == (
        f"CSV file {str(old)!r} already exists; results are never overwritten: pick a new name, "
        f"e.g. --csv {tmp_path / 'old'}-2.csv")
    assert _refused(str(old), "--json").startswith(f"invalid --json {str(old)!r}: it exists; files are never")
    assert old.read_text() == "keep me\n"


def test_overwrite_allows_an_existing_writable_file(tmp_path):
    old = tmp_path / "acc.xml"
    old.write_text("<old/>")
    assert check_new_file(old, "--junit", overwrite=True) == old


def test_a_missing_directory_unless_the_writer_makes_it(tmp_path):
    path = str(tmp_path / "nodir" / "r.json")
    assert _refused(path, "--out", example="results/report.html") == (
        f"invalid --out {path!r}: directory {str(tmp_path / 'nodir')!r} does not exist; e.g. --out results/report.html")
    assert check_new_file(path, "--json", parents_made=True) == tmp_path / "nodir" / "r.json"


def test_a_directory_is_not_a_file(tmp_path):
    assert "it is a directory; expected a file path" in _refused(str(tmp_path), "--junit", overwrite=True)


def test_an_unwritable_directory_is_named(tmp_path, monkeypatch):
    # As root permission bits stop nothing, so the reason comes from why_unwritable (read-only
    # mounts are tested for real in test_unwritable_out.py).
    from microbench.results import outputs

    monkeypatch.setattr(outputs, "why_unwritable", lambda d: f"directory {str(d)!r} is on a read-only filesystem")
    path = str(tmp_path / "p.png")
    assert _refused(path, "--out") == (
        f"invalid --out {path!r}: directory {str(tmp_path)!r} is on a read-only filesystem; e.g. --out p.png")


def test_a_caller_that_claims_the_file_itself_gets_only_the_name_checks(tmp_path, monkeypatch):
    from microbench.results import outputs

    monkeypatch.setattr(outputs, "why_unwritable", lambda d: "directory is on a read-only filesystem")
    assert check_new_file(tmp_path / "p.png", "--out", claimed=True) == tmp_path / "p.png"
