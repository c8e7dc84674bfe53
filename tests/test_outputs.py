"""The one check every file output goes through before anything is measured."""

from __future__ import annotations

import pytest
from conftest import one_error_line, symlink_loop
from conftest import refused as cli_refused

from microbench.core.errors import UsageError
from microbench.results.outputs import check_new_file, why_unwritable

GPU = ["--gpu", "h100", "--nodes", "1", "--gpus-per-node", "2"]


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


@pytest.mark.slow
def test_a_results_directory_that_is_a_symlink_is_refused_and_a_named_one_followed(run_cli, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "results").symlink_to(elsewhere)
    refused = run_cli("memory", "--sizes", "4K", "--iters", "1", "--warmup", "0")
    assert refused.returncode == 2
    assert (f"results directory 'results' is a symlink to '{elsewhere}'"
            in one_error_line(refused.stderr))
    assert list(elsewhere.iterdir()) == []
    suite = run_cli("suite", "--only", "memory")
    assert suite.returncode == 2 and "is a symlink" in one_error_line(suite.stderr)
    assert list(elsewhere.iterdir()) == []
    # Named by the user: --results-dir through the link, and a --json whose parent is the link.
    named = run_cli("memory", "--sizes", "4K", "--iters", "1", "--warmup", "0", "--results-dir", "results/")
    assert named.returncode == 0, named.stderr
    json_named = run_cli("memory", "--sizes", "4K", "--iters", "1", "--warmup", "0", "--json", "results/m.json")
    assert json_named.returncode == 0, json_named.stderr
    assert len(list(elsewhere.glob("*.json"))) == 2


@pytest.mark.slow
def test_an_empty_json_is_refused(cli, tmp_path):
    cli_refused(cli("memory", "--sizes", "1M", "--json", "", timeout=120), "invalid --json '': empty")
    assert list(tmp_path.iterdir()) == []


OUTPUT_CASES = [
    ("results-dir-a-file", ["memory", "--sizes", "1M", "--results-dir", "f"], {"f": "x"},
     "invalid --results-dir 'f': 'f' is a file, not a directory"),
    ("default-results-a-file", ["memory", "--sizes", "1M"], {"results": "x"},
     "invalid --results-dir 'results': 'results' is a file, not a directory"),
    ("results-dir-under-a-file", ["memory", "--sizes", "1M", "--results-dir", "f/sub"], {"f": "x"},
     "is a file, not a directory"),
    ("results-dir-a-loop", ["memory", "--sizes", "1M", "--results-dir", "loop"], {}, "'loop' is a symlink loop"),
    ("json-missing-dir", ["memory", "--sizes", "1M", "--json", "nodir/r.json"], {},
     "invalid --json 'nodir/r.json': directory 'nodir' does not exist"),
    ("compose-json-missing-dir", ["compose", "--net", "ib=40GB/s", *GPU, "--json", "nodir/c.json"], {},
     "invalid --json 'nodir/c.json': directory 'nodir' does not exist"),
    ("csv-missing-dir", ["memory", "--sizes", "1M", "--csv", "nodir/r.csv"], {},
     "invalid --csv 'nodir/r.csv': directory 'nodir' does not exist"),
    ("json-parent-a-file", ["memory", "--sizes", "1M", "--json", "f/r.json"], {"f": "x"},
     "'f' is a file, not a directory"),
    ("json-a-loop", ["memory", "--sizes", "1M", "--json", "loop"], {}, "'loop' is a symlink loop"),
]


@pytest.mark.slow
@pytest.mark.parametrize("argv,files,fragment", [c[1:] for c in OUTPUT_CASES], ids=[c[0] for c in OUTPUT_CASES])
def test_output_paths_are_checked_once_before_the_work(cli, tmp_path, argv, files, fragment):
    for name, content in files.items():
        (tmp_path / name).write_text(content)
    if "loop" in argv:
        symlink_loop(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    cli_refused(cli(*argv, timeout=120), fragment)
    assert sorted(p.name for p in tmp_path.iterdir()) == before


@pytest.mark.slow
@pytest.mark.root
@pytest.mark.parametrize("flag", ["--json", "--results-dir"])
def test_outputs_on_a_read_only_mount_exit_2(cli, tmp_path, read_only_dir, flag):
    value = str(read_only_dir / "r.json") if flag == "--json" else str(read_only_dir / "results")
    cli_refused(cli("memory", "--sizes", "1M", flag, value, timeout=120), f"invalid {flag}",
             "is on a read-only filesystem")
    assert list(read_only_dir.iterdir()) == [] and not (tmp_path / "results").exists()


@pytest.mark.root
def test_why_unwritable_names_the_read_only_mount(read_only_dir, tmp_path):
    assert why_unwritable(read_only_dir) == f"directory {str(read_only_dir)!r} is on a read-only filesystem"
    assert why_unwritable(tmp_path) is None
