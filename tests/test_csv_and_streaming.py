"""Every probe writes --csv; piped stdout (srun, CI) gets a line per finished case as it happens."""

from __future__ import annotations

import csv
import subprocess
import sys

import pytest
from conftest import cli_env

from microbench.cli import build_parser
from microbench.core.progress import Progress, row_brief


def _leaf_parsers(parser, prefix=()):
    import argparse

    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield prefix, parser
    for action in subs:
        for name, child in action.choices.items():
            yield from _leaf_parsers(child, (*prefix, name))


def test_every_command_that_writes_a_record_also_writes_csv():
    probes = []
    for name, parser in _leaf_parsers(build_parser()):
        flags = {flag for action in parser._actions for flag in action.option_strings}
        if "--iters" in flags:   # a sweeping probe
            probes.append(" ".join(name))
            assert "--csv" in flags, f"microbench {' '.join(name)} has no --csv"
    assert {"memory", "nccl", "link", "checkpoint", "storage posix", "storage fio", "storage s3",
            "storage gds"} <= set(probes)


@pytest.mark.slow
def test_csv_rows_and_streamed_lines_from_a_real_run(tmp_path):
    out = tmp_path / "m.csv"
    # Popen with a pipe: stdout is not a terminal, as under srun; read lines as they arrive.
    proc = subprocess.Popen([sys.executable, "-m", "microbench", "memory", "--sizes", "1M,4M", "--iters", "3",
                             "--warmup", "0", "--csv", str(out), "--json", str(tmp_path / "m.json")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env(), cwd=tmp_path)
    first = proc.stdout.readline()
    # The first case's line arrives before the run ends (the table comes last).
    assert first.startswith("# [1/") and "copy " in first and "GB/s" in first, first
    rest, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    streamed = [first] + [line for line in rest.splitlines() if line.startswith("# [")]
    with out.open() as handle:
        rows = list(csv.DictReader(handle))
    assert len(streamed) == len(rows) >= 2
    assert {r["size_bytes"] for r in rows} == {str(1 << 20), str(4 << 20)}
    assert all(float(r["copy_gbps"]) > 0 for r in rows)


def test_row_brief_picks_the_headline_number():
    assert row_brief({"busbw_gbps": 1.25, "algbw_gbps": 2.5}) == "busbw 1.25 GB/s"
    assert row_brief({"read_gbps": 0.5, "memory_ceiling_gbps": 9}) == "read 0.5 GB/s"
    assert row_brief({"rtt_us_p50": 28.16}) == "rtt p50 28.2 us"


def test_progress_lines_only_when_asked_for_auto(capsys):
    quiet = Progress(2, "memory", enabled=False)   # --progress off, or a rank other than 0
    quiet.step("memcpy 1M")
    quiet.advance({"copy_gbps": 3.0})
    assert capsys.readouterr().out == ""
