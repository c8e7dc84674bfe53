import pytest
from conftest import one_error_line

from microbench.accept.rules import Check, evaluate, load_checks
from microbench.core.errors import UsageError

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
    with pytest.raises(UsageError, match="thresholds file .*none.toml. does not exist"):
        load_checks(tmp_path / "none.toml")


def test_shipped_examples_parse():
    from pathlib import Path

    examples = Path(__file__).resolve().parent.parent / "examples"
    if not examples.is_dir():
        pytest.skip("examples/ is not beside tests/ (installed-package run)")
    for path in examples.glob("acceptance-*.toml"):
        assert load_checks(path)


def test_toml_falls_back_to_tomli_before_python_311(tmp_path, monkeypatch):
    """requires-python says >=3.10, where tomllib does not exist: the same parser as `tomli`
    must be used instead (pyproject installs it there)."""
    import sys
    import tomllib
    import types

    used = []
    tomli = types.ModuleType("tomli")
    tomli.loads = lambda text: used.append(text) or tomllib.loads(text)
    monkeypatch.setitem(sys.modules, "tomllib", None)   # `import tomllib` fails as on 3.10
    monkeypatch.setitem(sys.modules, "tomli", tomli)
    good = tmp_path / "t.toml"
    good.write_text('[[check]]\nstep = "nccl"\nop = "all_reduce"\nmetric = "busbw_gbps"\nmin = 2\n')
    assert load_checks(good) == [Check("nccl", "all_reduce", "busbw_gbps", 2, None, None)]
    assert used == [good.read_text()]
    monkeypatch.setitem(sys.modules, "tomli", None)     # and neither: one clear line, not a traceback
    with pytest.raises(UsageError, match="needs the tomli package"):
        load_checks(good)


def test_pyproject_installs_tomli_where_tomllib_is_missing():
    import tomllib
    from pathlib import Path

    project = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())["project"]
    assert project["requires-python"] == ">=3.10"
    assert any(dep.startswith("tomli") and "python_version < '3.11'" in dep for dep in project["dependencies"])


@pytest.mark.parametrize("check, needle", [
    ('step = "nosuch"\nop = "x"\nmin = 1', "unknown step 'nosuch' in check #1"),
    ('step = "memory"\nop = "memcpy_1t"\nmetric = "bogus_gbps"\nmin = 1', "unknown metric 'bogus_gbps' for step 'memory'"),
    ('step = "memory"\nop = "memcpy_1t"\nmin = 5\nmax = 1', "min = 5 is above max = 1"),
    ('step = "memory"\nop = "memcpy_1t"\nmni = 1\nmax = 9', "unknown key 'mni' in check #1"),
])
def test_a_thresholds_file_that_cannot_be_met_is_refused_before_the_suite(cli, tmp_path, check, needle):
    accept = tmp_path / "t.toml"
    accept.write_text(f"[[check]]\n{check}\n")
    done = cli("suite", "--only", "memory", "--accept", str(accept), "--results-dir", str(tmp_path / "r"))
    assert done.returncode == 2
    assert needle in one_error_line(done.stderr)
    assert not (tmp_path / "r").exists() and "# memory ..." not in done.stdout
