"""Numbers as people read them: sizes in the unit that reads (31.2M, never 32000K), no scientific
notation in a table or a progress line, and a bad value quoted as it was typed."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from conftest import cli_env, one_error_line
from microbench.core.progress import row_brief
from microbench.core.tables import text_table
from microbench.core.units import format_number, format_size, format_size_exact, parse_size

EXPONENT = re.compile(r"\d[eE][+-]?\d")


@pytest.mark.parametrize("size, shown", [
    (32000 << 10, "31.2M"), (2184448 << 10, "2.1G"), (16353608 << 10, "15.6G"), (1 << 20, "1M"), (4 << 30, "4G"),
    (1536, "1.5K"), (1000, "1000B"), ((1 << 30) - 1024, "1.0G"), (3 << 40, "3T"),
])
def test_sizes_print_in_the_largest_unit_they_reach(size, shown):
    assert format_size(size) == shown


@pytest.mark.parametrize("size", [32000 << 10, 1536, 1000, 3 << 20, 2184448 << 10])
def test_the_exact_form_is_what_a_flag_takes_back(size):
    assert parse_size(format_size_exact(size)) == size


@pytest.mark.parametrize("value, shown", [
    (25600.0, "25600"), (2.56e4, "25600"), (0.000123456, "0.000123"), (1.5, "1.5"), (2.0, "2"), (-3.14159, "-3.14"),
    (1e30, "1000000000000000019884624838656"), (0, "0"), (99.95, "100"),
])
def test_format_number_never_writes_an_exponent(value, shown):
    assert format_number(value) == shown


def test_a_text_table_keeps_formatted_cells_and_prints_floats_plainly():
    # tabulate alone turns the string "0.0000123" into 1.23e-05 and 25600.0 into 25600 or 2.56e+04.
    text = text_table([("read", "0.0000123", 25600.0, 1.23e-5, 7), ("write", "-", 0.5, 2.0, 12)],
                      headers=["op", "a", "b", "c", "n"])
    assert not EXPONENT.search(text), text
    assert "0.0000123" in text and "25600" in text
    # numbers stay right-aligned, as tabulate's own parsing aligned them
    lines = text.splitlines()
    assert lines[2].endswith(" 7") and lines[3].endswith("12")


def test_a_progress_line_names_a_rate_in_plain_digits():
    row = {"op": "read", "size_bytes": 1 << 20, "samples_per_s": 25600.0, "read_gbps": 0.00001234}
    brief = row_brief(row, {"kind": "dataload"})
    assert brief == "samples_per_s 25600", brief
    assert row_brief({"op": "x", "busbw_gbps": 0.0000123}, {"kind": "nccl"}) == "busbw 0.0000123 GB/s"


def _cli(cwd, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "microbench", *args], env=cli_env(), capture_output=True,
                          text=True, timeout=120, cwd=cwd)


@pytest.mark.slow
@pytest.mark.parametrize("args, quoted", [
    (("hunt", "--floor", "-1GB/s"), "'-1GB/s'"),
    (("compare", "a.json", "b.json", "--fail-on", "busbw:-x%"), "'busbw:-x%'"),
    (("storage", "posix", "--bs", "1M,1X"), "'1M,1X'"),
    (("dataload", "--sample-size", "8K-1X"), "'8K-1X'"),
])
def test_errors_quote_the_value_as_typed(args, quoted, tmp_path):
    done = _cli(tmp_path, *args)
    assert done.returncode == 2, done.stderr
    line = one_error_line(done.stderr)
    assert f"invalid {args[-2]} {quoted}" in line, line
