"""The nccl-tests table: columns that never run together, and lines printed as sizes finish."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import cli_env
from microbench.probes.nccl.table import CollectiveLayout, CollectiveStream, collective_table


def _row(op, size, placement, time_us, busbw, nwrong=0):
    return {"op": op, "size_bytes": size, "placement": placement, "count": size // 4, "dtype": "float32",
            "redop": "sum", "root": -1, "time_us": {"p50": time_us}, "algbw_gbps": size / time_us / 1e3,
            "busbw_gbps": busbw, "nwrong": nwrong}


def _columns_align(text: str) -> None:
    """Every value ends where its header name ends, with a space before it."""
    lines = text.splitlines()
    names = " " + next(line for line in lines if "size" in line and "count" in line)[1:]
    ends = [i + 1 for i, ch in enumerate(names) if ch != " " and (i + 1 == len(names) or names[i + 1] == " ")]
    data = [line for line in lines if line and not line.startswith("#")]
    assert data
    for line in data:
        tokens = line.split()
        assert len(tokens) == len(ends), line
        found = [i + 1 for i, ch in enumerate(line) if ch != " " and (i + 1 == len(line) or line[i + 1] == " ")]
        assert found == ends, f"{line!r} does not line up with {names!r}"


# An all_reduce on a slow gloo link: 4 GiB in 12.8 s, and a 1 GiB case that took 27 s.
BIG = [_row("all_reduce", 1 << 30, "out", 27003412.9, 0.04), _row("all_reduce", 1 << 30, "in", 12800029.2, 0.08),
       _row("all_reduce", 4 << 30, "out", 123456789.1, 0.03), _row("all_reduce", 4 << 30, "in", 51200116.8, 0.08)]


def test_columns_of_gib_sizes_and_long_times_stay_apart():
    text = collective_table("all_reduce", BIG, None)
    assert "-12800029.2" not in text
    _columns_align(text)


def test_a_time_wider_than_its_column_still_gets_a_space():
    layout = CollectiveLayout(1 << 20, 1 << 18)  # planned for 1 MiB
    line = layout.line({"out": _row("all_reduce", 1 << 20, "out", 1234567890123.4, 0.0)})
    assert " -1 1234567890123.4 " in line


def test_the_stream_prints_a_size_once_both_placements_are_in():
    cases = [("all_reduce", s, p) for s in (1 << 30, 4 << 30) for p in ("out", "in")]
    out: list[str] = []
    stream = CollectiveStream(cases, 4, emit=out.append)
    stream.on_row(BIG[0])
    assert len(out) == 1 and out[0].startswith("# all_reduce\n#")   # the header, no line yet
    stream.on_row(BIG[1])
    assert len(out) == 2 and out[1].split()[:6] == [str(1 << 30), str((1 << 30) // 4), "float", "sum", "-1",
                                                    "27003412.9"]
    stream.on_row(BIG[2])
    stream.on_row(BIG[3])
    assert len(out) == 4 and out[3].startswith("# fit")
    streamed = "\n".join(out)
    _columns_align(streamed)
    # The same layout as the table printed at the end, line for line.
    assert collective_table("all_reduce", BIG, None).splitlines()[2:] == streamed.splitlines()[2:6]


@pytest.mark.slow
def test_piped_output_shows_each_size_while_the_sweep_runs(tmp_path):
    record = tmp_path / "n.json"
    proc = subprocess.Popen([sys.executable, "-m", "microbench", "nccl", "--sizes", "64K-1M", "--nproc", "2",
                             "--iters", "3", "--warmup", "1", "--json", str(record)],
                            cwd=tmp_path, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        seen = []
        for line in proc.stdout:
            seen.append(line)
            if line.strip() and not line.startswith("#"):
                break
        # The first size of the first op is on our side of the pipe while the sweep goes on.
        status = json.loads(record.read_text())["status"] if record.exists() else "not yet written"
        still_running = proc.poll() is None
        rest, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert seen[0].startswith("# microbench nccl: 2 ranks") and seen[-1].split()[0] == str(64 << 10)
    assert still_running and status == "running", (still_running, status)
    assert json.loads(record.read_text())["status"] == "complete"
    assert rest.count("\n# fit") == 3 and f"\n{1 << 20:>12} " in rest
