import pytest

from microbench.errors import UsageError
from microbench.sizes import format_size, parse_size, parse_sizes


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
