"""The command line (cli.py): every command and subcommand prints its help, and a bad value of
any flag is refused with exit 2 and exactly one stderr line before anything is measured,
created or written."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from conftest import one_error_line


def _parser_paths() -> list[list[str]]:
    from microbench.cli import build_parser

    found: list[list[str]] = []

    def walk(parser: argparse.ArgumentParser, path: list[str]) -> None:
        found.append(path)
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    walk(child, [*path, name])

    walk(build_parser(), [])
    return found


PARSER_PATHS = _parser_paths()


@pytest.mark.parametrize("path", PARSER_PATHS, ids=[" ".join(p) or "microbench" for p in PARSER_PATHS])
def test_every_command_and_subcommand_prints_its_help(path, capsys):
    # compare and report once crashed here: an unescaped % in a help text (argparse formats it).
    from microbench.cli import build_parser

    with pytest.raises(SystemExit) as info:
        build_parser().parse_args([*path, "--help"])
    assert info.value.code == 0
    assert capsys.readouterr().out.startswith("usage: microbench")


def test_the_walk_reaches_two_word_commands():
    assert ["compare"] in PARSER_PATHS and ["report"] in PARSER_PATHS and ["storage", "posix"] in PARSER_PATHS
    assert ["lab", "shape"] in PARSER_PATHS


RECORD = {"schema_version": 1, "kind": "nccl", "status": "complete", "config": {}, "environment": {},
          "implementation": {}, "rows": [{"op": "all_reduce", "size_bytes": 1 << 20, "busbw_gbps": 1.0}]}


# (test id, argv, a fragment of the one stderr line, files to write in the working directory first)
CASES = [
    ("timeout-nan-nccl", ["nccl", "--sizes", "1M", "--nproc", "2", "--timeout", "nan"], "invalid --timeout 'nan'", {}),
    ("timeout-nan-link", ["link", "--sizes", "1M", "--timeout", "nan"], "invalid --timeout 'nan'", {}),
    ("timeout-inf-checkpoint", ["checkpoint", "--size", "1M", "--nproc", "2", "--target", ".", "--timeout", "inf"],
     "invalid --timeout 'inf'", {}),
    ("storage-posix-empty-path", ["storage", "posix", "--path", "", "--size", "1M"], "--path '' is empty", {}),
    ("plot-out-no-directory", ["plot", "r.json", "--out", "nodir/p.png"], "directory 'nodir' does not exist",
     {"r.json": RECORD}),
    ("plot-json-list", ["plot", "r.json", "--out", "p.png"], "holds a JSON list, not an object", {"r.json": [RECORD]}),
    ("plot-rows-not-objects", ["plot", "r.json", "--out", "p.png"], "rows are not a list of objects (row 1 is a JSON string)",
     {"r.json": {**RECORD, "rows": [RECORD["rows"][0], "all_reduce 1.0"]}}),
    ("plot-rows-not-a-list", ["plot", "r.json", "--out", "p.png"], "rows are not a list of objects (they are a JSON object)",
     {"r.json": {**RECORD, "rows": {"op": "all_reduce"}}}),
    ("factor-nan-nccl", ["nccl", "--sizes", "1M-4M", "--nproc", "2", "--factor", "nan"], "invalid --factor 'nan'", {}),
    ("factor-inf-nccl", ["nccl", "--sizes", "1M-4M", "--nproc", "2", "--factor", "inf"], "invalid --factor 'inf'", {}),
    ("factor-nan-link", ["link", "--sizes", "1M-4M", "--factor", "nan"], "invalid --factor 'nan'", {}),
    ("factor-inf-link", ["link", "--sizes", "1M-4M", "--factor", "inf"], "invalid --factor 'inf'", {}),
    ("budget-nan", ["memory", "--sizes", "1M", "--budget", "nan"], "invalid --budget 'nan'", {}),
    ("budget-inf", ["memory", "--sizes", "1M", "--budget", "inf"], "invalid --budget 'inf'", {}),
    ("suite-only-empty", ["suite", "--only", ""], "invalid --only '': empty", {}),
    ("link-pair-without-lab", ["link", "--sizes", "1M", "--pair", "x"], "--pair 'x' needs --lab NAME", {}),
    ("accept-min-not-a-number", ["suite", "--only", "memory", "--accept", "t.toml"], 'min = "fast": expected a finite',
     {"t.toml": '[[check]]\nstep = "memory"\nop = "memcpy_1t"\nmetric = "copy_gbps"\nmin = "fast"\n'}),
    ("accept-max-nan", ["suite", "--only", "memory", "--accept", "t.json"], "holds NaN at check[0].max",
     {"t.json": '{"check": [{"step": "memory", "op": "memcpy_1t", "metric": "copy_gbps", "max": NaN}]}'}),
    ("csv-existing-memory", ["memory", "--sizes", "1M", "--csv", "old.csv"], "CSV file 'old.csv' already exists",
     {"old.csv": "keep me\n"}),
    ("csv-existing-nccl", ["nccl", "--sizes", "1M", "--nproc", "2", "--csv", "old.csv"],
     "CSV file 'old.csv' already exists", {"old.csv": "keep me\n"}),
    ("link-result-json-list", ["nccl", "--sizes", "1M", "--nproc", "2", "--link-result", "l.json"],
     "is not a finished `microbench link` record", {"l.json": [{"kind": "link"}]}),
    ("link-result-nan", ["nccl", "--sizes", "1M", "--nproc", "2", "--link-result", "l.json"],
     "holds NaN at summary.link_gbps", {"l.json": '{"kind": "link", "summary": {"link_gbps": NaN}}'}),
    ("csv-no-directory", ["memory", "--sizes", "1M", "--csv", "nodir/r.csv"], "directory 'nodir' does not exist", {}),
]


def _write(where: Path, files: dict) -> None:
    for name, content in files.items():
        (where / name).write_text(content if isinstance(content, str) else json.dumps(content))


@pytest.mark.parametrize("argv,fragment,files", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_refused_with_exit_2_andone_error_line(cli, tmp_path, argv, fragment, files):
    _write(tmp_path, files)
    before = sorted(p.name for p in tmp_path.iterdir())
    done = cli(*argv, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert fragment in one_error_line(done.stderr)
    # Refused before anything ran: no record, no plot, no scratch; the files given are untouched.
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    for name, content in files.items():
        assert (tmp_path / name).read_text() == (content if isinstance(content, str) else json.dumps(content))
