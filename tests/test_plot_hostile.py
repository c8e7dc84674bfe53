"""plot and report on records a hostile user hands them: labels are text (a file named
`$x^{$.json` is not TeX), a record of the wrong kind or a NaN is refused with exit 2 naming the
file and the field, a row that cannot be drawn is left out with a line saying so, and nothing a
plotting library says ever reaches stderr."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from conftest import cli_env, one_error_line
from microbench.results import RecordWriter, new_record

pytest.importorskip("matplotlib")


def _nccl(path: Path, busbw: dict[int, float] | None = None, **row_extra) -> Path:
    rec = new_record("nccl", {}, {}, {})
    rec["rows"] = [{"op": "all_gather", "placement": "out", "size_bytes": s, "busbw_gbps": g, **row_extra}
                   for s, g in (busbw or {1 << 20: 0.5, 4 << 20: 0.9, 16 << 20: 1.1}).items()]
    return RecordWriter(rec, path).finish("complete")


def _cli(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "microbench", *args], cwd=cwd, env=cli_env(), capture_output=True,
                          text=True, timeout=120)


@pytest.mark.slow
def test_a_file_named_like_tex_is_a_label_in_plot_and_report(tmp_path):
    odd = _nccl(tmp_path / "$x^{$.json")
    plain = _nccl(tmp_path / "plain.json")
    for args in (("plot", str(odd), str(plain), "--out", "a.png"), ("plot", f"$x^{{$={plain}", str(odd), "--out", "b.png"),
                 ("report", str(odd), str(plain), "--out", "r.html")):
        done = _cli(tmp_path, *args)
        assert done.returncode == 0 and done.stderr == "", (args, done.stderr)


@pytest.mark.slow
def test_a_compose_record_is_not_plotted(tmp_path):
    record = new_record("compose", {}, {}, {})
    record["rows"] = [{"op": "step", "network": "ib", "step_s": 1.5, "breakeven_busbw_gbps": 12.0}]
    path = RecordWriter(record, tmp_path / "c.json").finish("complete")
    done = _cli(tmp_path, "plot", str(path), "--out", "c.png")
    assert done.returncode == 2, done.stderr
    assert one_error_line(done.stderr) == (
        f"microbench: {str(path)!r} has no breakeven_busbw_gbps per size to plot: it is a 'compose' record, not a "
        f"probe's measurement per size; plot a probe's record, e.g. results/suite-*/nccl.json")
    assert not (tmp_path / "c.png").exists()


@pytest.mark.slow
@pytest.mark.parametrize("command", ["plot", "report"])
@pytest.mark.parametrize("literal", ["NaN", "Infinity"])
def test_nan_and_inf_are_refused_naming_file_and_field(tmp_path, command, literal):
    path = _nccl(tmp_path / "n.json")
    path.write_text(path.read_text().replace('"busbw_gbps": 0.9', f'"busbw_gbps": {literal}'))
    done = _cli(tmp_path, command, str(path), "--out", "o.html" if command == "report" else "o.png")
    assert done.returncode == 2, done.stderr
    assert f"{str(path)!r} holds {literal} at rows[1].busbw_gbps" in one_error_line(done.stderr)


@pytest.mark.slow
def test_a_row_without_a_size_is_left_out_with_a_line_and_no_warning(tmp_path):
    path = _nccl(tmp_path / "z.json", {1 << 20: 0.5, 0: 0.7, 16 << 20: 1.1})
    done = _cli(tmp_path, "plot", str(path), "--out", "z.png")
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert (f"# left out of the plot: {path} row 1 (all_gather): size_bytes is 0, not a positive whole number "
            f"of bytes") in done.stdout
    report = _cli(tmp_path, "report", str(path), "--out", "z.html")
    assert report.returncode == 0 and report.stderr == "", report.stderr
    assert "row 1 (all_gather): size_bytes is 0" in (tmp_path / "z.html").read_text()


def test_legends_are_words():
    from microbench.accept.plots import series

    rows = [{"op": "write", "size_bytes": 1 << 20, "write_gbps": 1.0, "tool": "posix", "threads": 1, "qd": 4},
            {"op": "write", "size_bytes": 16 << 20, "write_gbps": 1.1, "tool": "posix", "threads": 1, "qd": 4},
            {"op": "write", "size_bytes": 16 << 20, "write_gbps": 0.6, "tool": "posix", "threads": 1, "qd": 1,
             "stream": "single"}]
    assert set(series({"kind": "storage_posix", "rows": rows}, "write_gbps")) == {"write, 4 streams", "write, 1 stream"}
    nccl = [{"op": "all_gather", "size_bytes": 1 << 20, "busbw_gbps": 1.0, "placement": p} for p in ("out", "in")]
    assert set(series({"kind": "nccl", "rows": nccl}, "busbw_gbps")) == {"all_gather, out-of-place",
                                                                        "all_gather, in-place"}


@pytest.mark.slow
def test_the_value_axis_starts_at_zero():
    from microbench.accept.plots import draw
    from microbench.core.pyplot import pyplot

    plt = pyplot()
    record = {"kind": "nccl", "rows": [{"op": "all_gather", "size_bytes": s, "busbw_gbps": g}
                                       for s, g in ((1 << 20, 10.0), (4 << 20, 9.4))]}
    fig = draw(plt, [("a", record)], "busbw_gbps")
    assert fig.axes[0].get_ylim()[0] == 0
    plt.close(fig)
