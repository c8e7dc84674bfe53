"""Pictures are part of the main job (issue 20 item 20): matplotlib is a main dependency, a
command asked for a picture it cannot draw exits 1, and no message or document advises
installing this project by name from a package index (there `microbench` is another project)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

from conftest import PKG_PARENT, one_error_line

from microbench.results import RecordWriter, new_record

ROOT = Path(__file__).resolve().parent.parent


def _record(tmp_path: Path) -> Path:
    rec = new_record("nccl", {}, {}, {})
    rec["rows"] = [{"op": "all_reduce", "placement": "out", "size_bytes": s, "busbw_gbps": g}
                   for s, g in ((1 << 20, 0.5), (4 << 20, 0.9))]
    return RecordWriter(rec, tmp_path / "a.json").finish("complete")


def _without_matplotlib(tmp_path: Path) -> dict[str, str]:
    """An environment where `import matplotlib` fails, as on a machine that lacks it."""
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "matplotlib.py").write_text("raise ImportError('No module named matplotlib (hidden by the test)')\n")
    return {"PYTHONPATH": f"{hide}:{PKG_PARENT}"}


def test_matplotlib_is_a_main_dependency_and_no_plot_extra_is_needed():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert any(re.match(r"matplotlib\b", dep) for dep in project["dependencies"])
    assert "plot" not in project.get("optional-dependencies", {})


@pytest.mark.slow
def test_plot_without_matplotlib_exits_1_and_names_the_checkout(run_cli, tmp_path):
    record = _record(tmp_path)
    done = run_cli("plot", str(record), "--out", str(tmp_path / "p.png"), env=_without_matplotlib(tmp_path))
    assert done.returncode == 1, done.stdout + done.stderr
    line = one_error_line(done.stderr)
    assert "matplotlib" in line and "pip install ." in line and "microbench[" not in line
    assert not (tmp_path / "p.png").exists()


@pytest.mark.slow
def test_report_without_matplotlib_exits_1_instead_of_a_page_without_plots(run_cli, tmp_path):
    record = _record(tmp_path)
    done = run_cli("report", str(record), "--out", str(tmp_path / "r.html"), env=_without_matplotlib(tmp_path))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "matplotlib" in one_error_line(done.stderr)
    assert not (tmp_path / "r.html").exists()


# `pip install microbench`, `pip install 'microbench[plot]'`, `pip install --no-deps microbench`.
INDEX_INSTALL = re.compile(r"pip install(?:\s+--?[\w-]+)*\s+['\"]?microbench\b")


def test_nothing_advises_installing_microbench_from_an_index():
    offenders = []
    for path in ROOT.rglob("*"):
        if (path.suffix not in (".py", ".md", ".toml", ".txt", ".cfg", ".yml", ".yaml", ".sh", "") or not path.is_file()
                or ".git" in path.parts or "results" in path.parts or path == Path(__file__).resolve()):
            continue
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        offenders += [f"{path.relative_to(ROOT)}: {m.group(0)}" for m in INDEX_INSTALL.finditer(text)]
    assert offenders == []
