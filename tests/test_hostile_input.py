"""Issue 20, items 9-16, 18, 19 and 21: inputs and outputs a hostile user names. Each is refused
with exit 2 and one stderr line before any work (nothing measured, no record, no empty results
directory), or, for a closed stdout, ends quietly with the SIGPIPE convention's status."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import cli_env, refused as _refused


def _loop(where: Path, name: str = "loop") -> Path:
    link = where / name
    link.symlink_to(name)   # itself: ELOOP on every lookup
    return link


# --------------------------------------------------------------------------- 9: --help everywhere


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


# --------------------------------------------------------------------------- 11: one JSON loader


def _bad_files(where: Path) -> dict[str, Path]:
    files = {"random": where / "random.json", "utf16": where / "utf16.json", "deep": where / "deep.json"}
    files["random"].write_bytes(bytes([0x7b, 0x22, 0x61, 0x22, 0xae, 0xff, 0xfe, 0x00, 0x93]) * 20)
    files["utf16"].write_text('{"kind": "nccl"}', encoding="utf-16")
    files["deep"].write_text("[" * 100_000)
    files["loop"] = _loop(where)
    (where / "adir").mkdir()
    files["directory"] = where / "adir"
    return files


LOADER_SAYS = {"random": "is not UTF-8 text (byte 0xae at offset 4)", "utf16": "is UTF-16 text, not UTF-8",
               "deep": "nests deeper than 64 levels", "loop": "is a symlink loop",
               "directory": "is a directory"}


@pytest.mark.parametrize("kind", sorted(LOADER_SAYS))
def test_the_loader_says_what_the_file_is_not(tmp_path, kind):
    from microbench.core.errors import UsageError
    from microbench.core.jsonfile import load_json

    path = _bad_files(tmp_path)[kind]
    with pytest.raises(UsageError) as info:
        load_json(path, what="--nccl", expected="a record")
    text = str(info.value)
    assert text.startswith(f"--nccl {str(path)!r} {LOADER_SAYS[kind]}") and text.endswith("; expected a record")


def test_the_loader_bounds_depth_below_the_interpreters_limit(tmp_path):
    # 100 levels parse in Python's json, but no input of ours nests so deep.
    from microbench.core.errors import UsageError
    from microbench.core.jsonfile import MAX_JSON_DEPTH, load_json

    ok, deep = tmp_path / "ok.json", tmp_path / "deep.json"
    ok.write_text("[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH)
    deep.write_text("[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1))
    assert load_json(ok, what="x", expected="y") is not None
    with pytest.raises(UsageError, match="nests deeper than 64 levels"):
        load_json(deep, what="x", expected="y")


def test_the_loader_refuses_a_fifo_without_blocking_and_nan(tmp_path):
    from microbench.core.errors import UsageError
    from microbench.core.jsonfile import load_json

    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    with pytest.raises(UsageError, match="is not a regular file"):
        load_json(fifo, what="x", expected="y")
    nan = tmp_path / "nan.json"
    nan.write_text('{"hidden_size": NaN}')
    for finite in (False, True):   # records too: one rule for every file (tests/test_absurd_numbers.py)
        with pytest.raises(UsageError, match="holds NaN at hidden_size: every number in it must be finite"):
            load_json(nan, what="x", expected="y", finite=finite)


GPU = ["--gpu", "h100", "--nodes", "1", "--gpus-per-node", "2"]
# (command, file kind): every command that reads a JSON file, each kind of bad file at least once.
LOADER_CLI = [
    (["plot", "{f}"], "directory"),
    (["plot", "{f}"], "random"),
    (["compare", "{f}", "{f}"], "utf16"),
    (["report", "{f}", "--out", "r.html"], "deep"),
    (["compose", "--nccl", "{f}", *GPU], "loop"),
    (["compose", "--nccl", "{f}", *GPU], "utf16"),
    (["compose", "--model-config", "{f}", "--net", "ib=40GB/s", *GPU], "random"),
    (["compose", "--model-config", "{f}", "--net", "ib=40GB/s", *GPU], "deep"),
    (["compose", "--calibration", "{f}", "--net", "ib=40GB/s", *GPU], "loop"),
    (["compose", "--compute", "{f}", "--net", "ib=40GB/s", "--ranks", "2"], "random"),
]


@pytest.mark.parametrize("argv,kind", LOADER_CLI, ids=[f"{a[0]}-{a[1]}-{k}" for a, k in LOADER_CLI])
def test_every_json_argument_goes_through_the_loader(run_cli, tmp_path, argv, kind):
    path = _bad_files(tmp_path)[kind]
    done = run_cli(*[a.format(f=path.name) for a in argv], timeout=120)
    _refused(done, LOADER_SAYS[kind])
    assert not (tmp_path / "results").exists() and not (tmp_path / "r.html").exists()


# --------------------------------------------------------------------------- 12, 19: numbers in files


def _nccl_record(busbw_at_4m: float) -> dict:
    rows = []
    for op in ("all_gather", "reduce_scatter"):
        for size in (1 << 20, 4 << 20, 16 << 20):
            t = 100e-6 + size * 0.5 / 1e9
            rows.append({"op": op, "size_bytes": size, "placement": "out", "ranks": 2, "time_us": {"p50": t * 1e6},
                         "algbw_gbps": size / t / 1e9, "busbw_gbps": size / t / 1e9 * 0.5})
    rows[1]["busbw_gbps"] = busbw_at_4m
    return {"schema_version": 1, "kind": "nccl", "status": "complete", "config": {"world": {"size": 2}},
            "environment": {}, "implementation": {"backend": "nccl", "device": "cuda"}, "rows": rows}


def test_compose_refuses_a_nan_busbw_row(run_cli, tmp_path):
    (tmp_path / "n.json").write_text(json.dumps(_nccl_record(float("nan"))))
    _refused(run_cli("compose", "--nccl", "n.json", *GPU, timeout=120),
             "'n.json' holds NaN at rows[1].busbw_gbps: every number in it must be finite")
    # The same record with a number there predicts: only the NaN was refused.
    (tmp_path / "ok.json").write_text(json.dumps(_nccl_record(1.0)))
    assert run_cli("compose", "--nccl", "ok.json", *GPU, "--json", "c.json", timeout=120).returncode == 0


HF = {"hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 4,
      "intermediate_size": 14336, "vocab_size": 32000}


@pytest.mark.parametrize("text,fragment", [
    (json.dumps(HF).replace("4096", "NaN"), "holds NaN at hidden_size: every number in it must be finite"),
    (json.dumps(HF).replace("4096", "Infinity"), "holds Infinity at hidden_size: every number in it must be finite"),
    (json.dumps({**HF, "num_key_value_heads": 3}),
     "num_key_value_heads 3 does not divide num_attention_heads 32; expected a divisor of it, e.g. 2"),
    (json.dumps({**HF, "num_key_value_heads": 64}), "num_key_value_heads 64 does not divide num_attention_heads 32"),
], ids=["hidden-nan", "hidden-inf", "kv-heads-3-of-32", "kv-heads-64-of-32"])
def test_compose_checks_the_numbers_of_a_model_config(run_cli, tmp_path, text, fragment):
    (tmp_path / "config.json").write_text(text)
    _refused(run_cli("compose", "--model-config", "config.json", "--net", "ib=40GB/s", *GPU, timeout=120), fragment)
    assert not (tmp_path / "results").exists()


def test_a_model_config_whose_heads_divide_is_accepted(tmp_path):
    from microbench.compose.model import from_hf_config

    (tmp_path / "config.json").write_text(json.dumps(HF))
    assert from_hf_config(tmp_path / "config.json").kv_heads == 8


# --------------------------------------------------------------------------- 13: --timeout maximum


def test_parse_timeout_has_a_documented_maximum():
    from microbench.core.errors import UsageError
    from microbench.core.units import MAX_TIMEOUT_S, parse_timeout

    assert MAX_TIMEOUT_S == 86400 and parse_timeout("86400") == 86400.0 and parse_timeout("0.5") == 0.5
    for text in ("1e300", "1e10", "86401"):
        with pytest.raises(UsageError, match=f"invalid --timeout '{text}': must be at most 86400"):
            parse_timeout(text)
    manual = (Path(__file__).resolve().parent.parent / "docs" / "manual.md").read_text()
    assert "at most 86400 s" in manual


@pytest.mark.parametrize("argv", [
    ["nccl", "--sizes", "1M", "--nproc", "2", "--timeout", "1e300"],
    ["nccl", "--sizes", "1M", "--nproc", "2", "--timeout", "1e10"],
    ["link", "--sizes", "1M", "--timeout", "1e300"],
    ["checkpoint", "--size", "1M", "--nproc", "2", "--target", "ck", "--timeout", "1e300"],
    ["storage", "s3", "--endpoint", "http://127.0.0.1:1", "--bucket", "bkt", "--timeout", "1e300"],
], ids=["nccl-1e300", "nccl-1e10", "link-1e300", "checkpoint-1e300", "s3-1e300"])
def test_a_timeout_above_the_maximum_is_refused_naming_it(run_cli, tmp_path, argv):
    _refused(run_cli(*argv, timeout=120), f"invalid --timeout {argv[-1]!r}: must be at most 86400")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


# --------------------------------------------------------------------------- 14: queue depth


def test_a_queue_depth_the_engine_cannot_take_is_refused_with_the_limit(run_cli, tmp_path):
    (tmp_path / "st").mkdir()
    line = _refused(run_cli("storage", "posix", "--path", "st", "--bs", "4K", "--qd", "60000", timeout=120),
                    "invalid --qd 60000: the native engine takes at most 32768 I/Os in flight per worker")
    assert "alignment" not in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["st"] and not any((tmp_path / "st").iterdir())


# --------------------------------------------------------------------------- 15, 16: output paths


def test_an_empty_json_is_refused(run_cli, tmp_path):
    _refused(run_cli("memory", "--sizes", "1M", "--json", "", timeout=120), "invalid --json '': empty")
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


@pytest.mark.parametrize("argv,files,fragment", [c[1:] for c in OUTPUT_CASES], ids=[c[0] for c in OUTPUT_CASES])
def test_output_paths_are_checked_once_before_the_work(run_cli, tmp_path, argv, files, fragment):
    for name, content in files.items():
        (tmp_path / name).write_text(content)
    if "loop" in argv:
        _loop(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    _refused(run_cli(*argv, timeout=120), fragment)
    assert sorted(p.name for p in tmp_path.iterdir()) == before


@pytest.mark.parametrize("flag", ["--json", "--results-dir"])
def test_outputs_on_a_read_only_mount_exit_2(run_cli, tmp_path, read_only_dir, flag):
    value = str(read_only_dir / "r.json") if flag == "--json" else str(read_only_dir / "results")
    _refused(run_cli("memory", "--sizes", "1M", flag, value, timeout=120), f"invalid {flag}",
             "is on a read-only filesystem")
    assert list(read_only_dir.iterdir()) == [] and not (tmp_path / "results").exists()


# --------------------------------------------------------------------------- 10: suite --path, --results-dir


def _suite_case(tmp_path: Path, read_only_dir: Path, case: str) -> list[str]:
    if case == "path-a-file":
        (tmp_path / "f").write_text("x")
        return ["--path", "f"]
    if case == "path-missing":
        return ["--path", "nowhere"]
    if case == "path-read-only":
        return ["--path", str(read_only_dir)]
    if case == "path-a-loop":
        _loop(tmp_path)
        return ["--path", "loop"]
    if case == "results-dir-a-file":
        (tmp_path / "f").write_text("x")
        return ["--results-dir", "f"]
    return ["--results-dir", str(read_only_dir / "results")]


SUITE_SAYS = {"path-a-file": "--path 'f' is not a directory", "path-missing": "--path 'nowhere' does not exist",
              "path-read-only": "is on a read-only filesystem", "path-a-loop": "--path 'loop' is a symlink loop",
              "results-dir-a-file": "invalid --results-dir 'f': 'f' is a file, not a directory",
              "results-dir-read-only": "is on a read-only filesystem"}


@pytest.mark.parametrize("case", sorted(SUITE_SAYS))
def test_suite_refuses_its_paths_before_making_a_results_directory(run_cli, tmp_path, read_only_dir, case):
    argv = _suite_case(tmp_path, read_only_dir, case)
    before = sorted(p.name for p in tmp_path.iterdir())
    _refused(run_cli("suite", "--only", "memory", *argv, timeout=120), SUITE_SAYS[case])
    assert sorted(p.name for p in tmp_path.iterdir()) == before   # no results/suite-* left behind
    assert list(read_only_dir.iterdir()) == []


# --------------------------------------------------------------------------- 18: checkpoint --target loop


@pytest.mark.parametrize("target", ["loop", "loop/sub"])
def test_checkpoint_target_through_a_symlink_loop(run_cli, tmp_path, target):
    _loop(tmp_path)
    _refused(run_cli("checkpoint", "--size", "1M", "--nproc", "2", "--target", target, "--iters", "1", timeout=120),
             f"invalid --target '{tmp_path / target}'", f"{tmp_path / 'loop'} is a symlink loop")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["loop"]


# --------------------------------------------------------------------------- 21: a closed stdout


def _with_closed_stdout(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """`microbench ARGV | head -0`, deterministically: the pipe's reader is gone before the first write."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run([sys.executable, "-m", "microbench", *argv], cwd=cwd, env=cli_env(), stdout=write_end,
                              stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write_end)


def test_compose_into_a_closed_pipe_ends_quietly(tmp_path):
    done = _with_closed_stdout(["compose", "--model", "llama-3.1-8b", "--net", "ib=40GB/s", *GPU], tmp_path)
    assert done.stderr == "" and done.returncode == 141


def test_lab_shape_into_a_closed_pipe_ends_quietly(lab, tmp_path):
    done = _with_closed_stdout(["lab", "shape", "--name", lab.name, "--link", "100mbit"], tmp_path)
    assert done.stderr == "" and done.returncode == 141
