import pytest

from microbench.accept import Check, evaluate, load_checks
from microbench.errors import UsageError

RECORD = {"rows": [
    {"op": "all_reduce", "size_bytes": 1 << 20, "busbw_gbps": 1.0, "time_us": {"p50": 50.0}},
    {"op": "all_reduce", "size_bytes": 1 << 30, "busbw_gbps": 3.0, "time_us": {"p50": 9.0}},
]}


def test_floor_uses_the_best_row_and_ceiling_the_lowest():
    results = evaluate([Check("c", "all_reduce", "busbw_gbps", min=2.5),
                        Check("c", "all_reduce", "busbw_gbps", min=3.5)], {"c": RECORD})
    assert [r.status for r in results] == ["pass", "fail"]
    assert results[0].value == 3.0 and "needs >= 3.5" in results[1].detail


def test_size_pins_the_row():
    (result,) = evaluate([Check("c", "all_reduce", "busbw_gbps", min=2.0, size_bytes=1 << 20)], {"c": RECORD})
    assert result.status == "fail" and result.value == 1.0


def test_missing_step_or_rows_is_not_a_pass():
    results = evaluate([Check("x", "all_reduce", "busbw_gbps", min=1), Check("c", "all_gather", "busbw_gbps", min=1)],
                       {"x": None, "c": RECORD})
    assert [r.status for r in results] == ["missing", "missing"]


def test_load_checks_toml_and_errors(tmp_path):
    good = tmp_path / "t.toml"
    good.write_text('[[check]]\nstep = "collectives"\nop = "all_reduce"\nmetric = "busbw_gbps"\nmin = 1\nsize = "1M"\n')
    assert load_checks(good) == [Check("collectives", "all_reduce", "busbw_gbps", 1, None, 1 << 20)]
    bad = tmp_path / "b.toml"
    bad.write_text('[[check]]\nstep = "collectives"\n')
    with pytest.raises(UsageError, match="needs step, op, metric and min or max"):
        load_checks(bad)
    with pytest.raises(UsageError, match="cannot read thresholds file"):
        load_checks(tmp_path / "none.toml")


def test_shipped_examples_parse():
    from pathlib import Path

    examples = Path(__file__).resolve().parent.parent / "examples"
    if not examples.is_dir():
        pytest.skip("examples/ is not beside tests/ (installed-package run)")
    for path in examples.glob("acceptance-*.toml"):
        assert load_checks(path)
