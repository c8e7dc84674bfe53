"""Acceptance relative to the expected bandwidth: min_fraction_of_expected and its bad inputs."""

from __future__ import annotations

import pytest

from microbench.accept.rules import Check, evaluate, load_checks
from microbench.core.errors import UsageError

from conftest import last_line

ROWS = [{"op": "all_gather", "size_bytes": 1 << 20, "busbw_gbps": 0.05},
        {"op": "all_gather", "size_bytes": 1 << 24, "busbw_gbps": 0.11}]
LAB = {"rows": ROWS, "summary": {"expected": {"all_gather": {"gbps": 0.125, "unknown_why": None}}}}
VM = {"rows": ROWS, "summary": {"expected": {"all_gather": {"gbps": None, "unknown_why": "eth0 reports no speed"}}}}


def _check(fraction: float, expected_gbps: float | None = None) -> Check:
    return Check("collectives", "all_gather", "busbw_gbps", min_fraction_of_expected=fraction,
                 expected_gbps=expected_gbps)


def test_fraction_of_the_records_expectation():
    ok, bad = evaluate([_check(0.8), _check(0.9)], {"collectives": LAB})
    # Best row 0.11 of 0.125 = 88%.
    assert ok.status == "pass" and "88% of expected 0.125 GB/s" in ok.detail
    assert bad.status == "fail" and "needs >= 90% of expected" in bad.detail


def test_unknown_expectation_is_not_a_pass_and_says_why():
    (result,) = evaluate([_check(0.8)], {"collectives": VM})
    assert result.status == "missing" and "eth0 reports no speed" in result.detail


def test_the_checks_own_expected_overrides_the_record():
    (result,) = evaluate([_check(0.8, expected_gbps=0.1)], {"collectives": VM})
    assert result.status == "pass" and "110% of expected" in result.detail


def test_link_records_have_one_expectation():
    record = {"rows": [{"op": "uni", "bw_gbps": 0.12}], "summary": {"expected": {"gbps": 0.125}}}
    (result,) = evaluate([Check("link", "uni", "bw_gbps", min_fraction_of_expected=0.95)], {"link": record})
    assert result.status == "pass"


def _toml(tmp_path, extra: str):
    path = tmp_path / "t.toml"
    path.write_text(f'[[check]]\nstep = "collectives"\nop = "all_gather"\nmetric = "busbw_gbps"\n{extra}\n')
    return path


def test_load(tmp_path):
    (check,) = load_checks(_toml(tmp_path, 'min_fraction_of_expected = 0.8\nexpected = "200Gbit"'))
    assert check.min_fraction_of_expected == 0.8 and check.expected_gbps == pytest.approx(25.0)


BAD = [("min_fraction_of_expected = 0", "(0, 1.5]"), ("min_fraction_of_expected = -0.5", "(0, 1.5]"),
       ("min_fraction_of_expected = 1.6", "(0, 1.5]"), ("min_fraction_of_expected = nan", "(0, 1.5]"),
       ('min_fraction_of_expected = "most"', "(0, 1.5]"), ("min_fraction_of_expected = true", "(0, 1.5]"),
       ('min_fraction_of_expected = 0.8\nexpected = "24"', "with a unit"),
       ('min_fraction_of_expected = 0.8\nexpected = "-24GB/s"', "positive"),
       ("min_fraction_of_expected = 0.8\nexpected = 24", "with a unit")]


@pytest.mark.parametrize("extra,needle", BAD)
def test_bad_thresholds(tmp_path, extra, needle):
    with pytest.raises(UsageError) as info:
        load_checks(_toml(tmp_path, extra))
    assert needle in str(info.value)


@pytest.mark.parametrize("extra", ["min_fraction_of_expected = 1.6", 'min_fraction_of_expected = 0.8\nexpected = "24"',
                                   'min_fraction_of_expected = 0.8\nexpected = "-1GB/s"'])
def test_suite_accept_bad_thresholds_exit_2_one_line(cli, tmp_path, extra):
    proc = cli("suite", "--accept", str(_toml(tmp_path, extra)))
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert "expected" in last_line(proc.stderr) and "Traceback" not in proc.stderr
