import pytest

from microbench.core.errors import UsageError
from microbench.core.units import format_size, parse_size, parse_sizes


def test_binary_units():
    assert parse_size("1K") == 1024
    assert parse_size("16M") == 16 << 20
    assert parse_size("4G") == 4 << 30
    assert parse_size("4096") == 4096
    assert parse_size("2GiB") == 2 << 30


def test_range_steps_by_factor_and_keeps_the_end():
    assert parse_sizes("1M-8M") == [1 << 20, 2 << 20, 4 << 20, 8 << 20]
    assert parse_sizes("1M-16M", factor=4) == [1 << 20, 4 << 20, 16 << 20]
    assert parse_sizes("1M-3M") == [1 << 20, 2 << 20, 3 << 20]


def test_list_and_single():
    assert parse_sizes("64M,1M,8M") == [1 << 20, 8 << 20, 64 << 20]
    assert parse_sizes("64M") == [64 << 20]


@pytest.mark.parametrize("spec, fragment", [
    ("1X-4G", "'1X'"), ("4G-1M", "starts above its end"), ("0", "greater than zero"),
    ("-5M", "negative"), ("", "empty"), ("1M-", "MIN-MAX"),
])
def test_bad_specs_quote_the_value(spec, fragment):
    with pytest.raises(UsageError) as info:
        parse_sizes(spec)
    assert fragment in str(info.value)
    assert "e.g." in str(info.value)


def test_format_size():
    assert format_size(1 << 20) == "1M"
    assert format_size(4 << 30) == "4G"
    assert format_size(1536) == "1.5K"


# ----------------------------------------------------------------- numbers, rates, durations
import math as _math
from pathlib import Path

import pytest as _pytest
from conftest import refused as _refused

from microbench.core.errors import UsageError as _UsageError
from microbench.core.units import (
    parse_bandwidth_bytes_per_s,
    parse_duration_s,
    parse_number,
    parse_positive,
)


@_pytest.mark.parametrize("bad", ["nan", "NaN", "inf", "-inf", "1e999", "", "fast", "1,5"])
def test_parse_number_rejects_non_finite_and_junk(bad):
    with _pytest.raises(_UsageError) as err:
        parse_number(bad, what="--budget", example="2")
    assert repr(bad) in str(err.value) and "e.g. --budget 2" in str(err.value)


def test_parse_number_bounds():
    assert parse_number("0", what="--x", example="1", minimum=0) == 0.0
    with _pytest.raises(_UsageError, match="more than 0"):
        parse_positive("0", what="--x", example="1")
    with _pytest.raises(_UsageError, match="at most 1.5"):
        parse_number("1.6", what="--x", example="1", maximum=1.5)
    with _pytest.raises(_UsageError, match="at least 1"):
        parse_number("0.5", what="--x", example="1", minimum=1)


@_pytest.mark.parametrize("text,expected", [("1.6GB/s", 1.6e9), ("40GB/s", 40e9), ("1gbit", 1.25e8),
                                             ("400Gbit", 5e10), ("100mbit", 1.25e7), ("500MB/s", 5e8),
                                             ("10Gbps", 1.25e9)])
def test_parse_bandwidth(text, expected):
    assert _math.isclose(parse_bandwidth_bytes_per_s(text, what="--net"), expected)


@_pytest.mark.parametrize("bad", ["6", "1.6", "fastGB/s", "1.6GB/h", "-1GB/s", "0GB/s", "nanGB/s", "infGbit"])
def test_parse_bandwidth_rejects(bad):
    with _pytest.raises(_UsageError) as err:
        parse_bandwidth_bytes_per_s(bad, what="--net")
    assert "--net" in str(err.value)


def test_parse_duration():
    assert _math.isclose(parse_duration_s("30us", what="--lat"), 30e-6)
    assert _math.isclose(parse_duration_s("1.5ms", what="--lat"), 1.5e-3)
    assert parse_duration_s("30min", what="--i") == 1800
    for bad in ("30", "nanus", "-1ms", "3 parsecs"):
        with _pytest.raises(_UsageError):
            parse_duration_s(bad, what="--lat")


# --------------------------------------------------------------------------- one home per unit

def test_probes_and_composer_share_one_dtype_table_and_one_bus_factor():
    """The composer predicts from what the probes measured: both must read the same figures,
    not copies that can drift."""
    from microbench.compose import curves, fsdp
    from microbench.core import units
    from microbench.probes import checkpoint, compute
    from microbench.probes import nccl as coll

    assert fsdp.DTYPE_BYTES is units.DTYPE_BYTES
    assert compute.DTYPE_BYTES is units.DTYPE_BYTES
    assert checkpoint.ELEM is units.DTYPE_BYTES
    assert checkpoint.DTYPES == coll.DTYPES == units.DTYPES == ("float32", "bfloat16", "float16")
    assert curves.bus_factor is units.bus_factor
    from microbench.verify import model as fm

    for dtype in units.DTYPES:
        assert fm.Precision(dtype, dtype, "policy").bytes == units.element_size(dtype)
    for op in coll.OPS:
        for n in (1, 2, 3, 8):
            assert coll.OPS[op].factor(n) == units.bus_factor(op, n)


def test_dtype_sizes():
    from microbench.core.units import element_size

    assert [element_size(d) for d in ("float32", "bfloat16", "float16")] == [4, 2, 2]


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
def test_a_timeout_above_the_maximum_is_refused_naming_it(cli, tmp_path, argv):
    _refused(cli(*argv, timeout=120), f"invalid --timeout {argv[-1]!r}: must be at most 86400")
    assert sorted(p.name for p in tmp_path.iterdir()) == []
