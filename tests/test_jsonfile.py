"""A number no reader may compute with (NaN, Infinity, 1e400, a 5,000-digit integer, 1e300) is
refused where every JSON file is read, core/jsonfile.py: exit 2, one line naming the file and the
field, before a plot, a compare, a report or the composer meets it (they ended in OverflowError,
ValueError or ZeroDivisionError: internal errors)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import cli_env, one_error_line, symlink_loop
from conftest import refused as _refused

from microbench.core.errors import UsageError
from microbench.core.jsonfile import load_json

HUGE_INT = "9" * 5000


@pytest.mark.parametrize("literal, shown", [
    ("NaN", "NaN"), ("Infinity", "Infinity"), ("-Infinity", "-Infinity"), ("1e400", "1e400"), ("1e300", "1e300"),
    ("-1e300", "-1e300"), ("1e-300", "1e-300"), (HUGE_INT, "999999999999... (a number of 5000 digits)"),
    ("10000000000000000000000000000000", "10000000000000000000000000000000"),
])
def test_the_loader_refuses_an_absurd_number_naming_its_field(tmp_path, literal, shown):
    path = tmp_path / "r.json"
    path.write_text('{"kind": "nccl", "rows": [{"op": "x", "time_us": {"p50": 1.5}}, '
                    '{"op": "y", "time_us": {"p50": %s}}]}' % literal)
    with pytest.raises(UsageError) as info:
        load_json(path, what="results file", expected="a record")
    assert str(info.value) == (f"results file {str(path)!r} holds {shown} at rows[1].time_us.p50: every number in "
                               f"it must be finite, and 0 or between 1e-30 and 1e30 in size; expected a record")


def test_the_first_absurd_number_in_the_files_order_is_named(tmp_path):
    path = tmp_path / "r.json"
    path.write_text('{"a": [1, {"b": NaN}], "c": Infinity}')
    with pytest.raises(UsageError, match=r"holds NaN at a\[1\]\.b:"):
        load_json(path, what="x", expected="y")
    path.write_text('[1e999]')
    with pytest.raises(UsageError, match=r"holds 1e999 at \[0\]:"):
        load_json(path, what="x", expected="y")


def test_sane_numbers_pass_unchanged(tmp_path):
    path = tmp_path / "c.json"
    values = {"zero": 0, "neg_zero": -0.0, "eps": 1e-12, "flops": 6.3e25, "bytes": 1 << 50, "seed": 2**64 - 1,
              "ratio": 0.5, "count": -3}
    path.write_text(json.dumps(values))
    assert load_json(path, what="x", expected="y") == values


GPU = ["--gpu", "h100", "--nodes", "1", "--gpus-per-node", "2"]
NET = ["--net", "ib=40GB/s"]
# Every command and flag that reads a JSON file a user names (the list).
READERS = [
    ["plot", "{f}"], ["compare", "{f}", "{f}"], ["report", "{f}", "--out", "{out}"],
    ["compose", "--nccl", "{f}", *GPU], ["compose", "--storage", "{f}", *GPU, *NET],
    ["compose", "--compute", "{f}", *NET, "--nodes", "1", "--gpus-per-node", "2"],
    ["compose", "--calibration", "{f}", *GPU, *NET], ["compose", "--dataload", "{f}", *GPU, *NET],
    ["compose", "--modelload", "{f}", *GPU, *NET], ["compose", "--serialize-rate", "{f}", *GPU, *NET],
    ["compose", "--model-config", "{f}", *GPU, *NET], ["nccl", "--link-result", "{f}", "--sizes", "1M"],
    ["verify", "fsdp", "--calibration", "{f}"], ["compute", "--model-config", "{f}"],
]


def _cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "microbench", *args], cwd=cwd, env=cli_env(), capture_output=True,
                          text=True, timeout=120)


@pytest.mark.slow
@pytest.mark.parametrize("argv", READERS, ids=[" ".join(a[:2]) for a in READERS])
def test_every_reader_refuses_a_5000_digit_number_with_exit_2(tmp_path, argv):
    record = tmp_path / "big.json"
    record.write_text('{"schema_version": 2, "kind": "nccl", "status": "complete", "config": {}, "environment": {}, '
                      '"implementation": {}, "rows": [{"op": "all_gather", "size_bytes": 1048576, "busbw_gbps": '
                      + HUGE_INT + '}]}')
    done = _cli([a.format(f=record, out=tmp_path / "r.html") for a in argv], tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    line = one_error_line(done.stderr)
    assert f"{str(record)!r} holds 999999999999... (a number of 5000 digits) at rows[0].busbw_gbps" in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.json"]   # refused before any work


@pytest.mark.slow
def test_compose_does_not_divide_by_zero_on_a_record_of_extreme_values(tmp_path):
    """A bandwidth of 1e300 whose time is 1e-300 us made compose end in ZeroDivisionError."""
    rows = []
    for op in ("all_gather", "reduce_scatter"):
        for size in (1 << 20, 4 << 20):
            rows.append({"op": op, "size_bytes": size, "placement": "out", "ranks": 2, "iters": 3, "warmup": 1,
                         "time_us": {k: 1e-300 for k in ("p50", "p95", "p99", "max", "min", "mean")} | {"n": 3},
                         "algbw_gbps": 1e300, "busbw_gbps": 1e300, "nwrong": 0, "count": size // 4,
                         "dtype": "float32", "redop": "sum", "root": -1, "probe": "nccl", "slowest_rank": 0,
                         "per_rank_time_us_p50": [1e-300, 1e-300]})
    record = {"schema_version": 2, "kind": "nccl", "status": "complete", "config": {"world": {"size": 2}},
              "environment": {}, "implementation": {"backend": "gloo", "device": "cpu"}, "rows": rows, "summary": {}}
    (tmp_path / "n.json").write_text(json.dumps(record))
    done = _cli(["compose", "--nccl", "n.json", *GPU], tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "'n.json' holds 1e-300 at rows[0].time_us.p50" in one_error_line(done.stderr)


def _bad_files(where: Path) -> dict[str, Path]:
    files = {"random": where / "random.json", "utf16": where / "utf16.json", "deep": where / "deep.json"}
    files["random"].write_bytes(bytes([0x7b, 0x22, 0x61, 0x22, 0xae, 0xff, 0xfe, 0x00, 0x93]) * 20)
    files["utf16"].write_text('{"kind": "nccl"}', encoding="utf-16")
    files["deep"].write_text("[" * 100_000)
    files["loop"] = symlink_loop(where)
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
    for finite in (False, True):   # records too: one rule for every file (the tests above)
        with pytest.raises(UsageError, match="holds NaN at hidden_size: every number in it must be finite"):
            load_json(nan, what="x", expected="y", finite=finite)


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
def test_every_json_argument_goes_through_the_loader(cli, tmp_path, argv, kind):
    path = _bad_files(tmp_path)[kind]
    done = cli(*[a.format(f=path.name) for a in argv], timeout=120)
    _refused(done, LOADER_SAYS[kind])
    assert not (tmp_path / "results").exists() and not (tmp_path / "r.html").exists()
