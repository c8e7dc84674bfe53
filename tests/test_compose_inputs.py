"""compose/inputs: compose's flags declared once in sections, parsed when argv is read. Misuse
is refused before anything is read or printed (exit 2, one stderr line, nothing on stdout),
however late the composer would have met the value; --help states every default; the record
keeps the sections' resolved values."""

from __future__ import annotations

import json

import pytest
from conftest import one_error_line
from conftest import refused as _refused

from microbench.cli import build_parser, main
from microbench.compose.inputs import ComposeOptions
from microbench.core import sections

GPU = ["--gpu", "h100", "--nodes", "1", "--gpus-per-node", "2"]

BASE = ["--gpu", "h100", "--ranks", "8", "--net", "ib=40GB/s"]
JOB = ["--model", "gemma-3-12b", "--nodes", "2", "--gpus-per-node", "8", "--gpu", "h100", "--net", "ib=40GB/s"]


def compose(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(["compose", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("argv, message", [
    # the data stall's and model load's inputs, once met only after the tables were printed
    ([*BASE, "--data-rate", "s3=900", "--sample-bytes", "0"], "invalid --sample-bytes '0': must be greater than zero"),
    ([*BASE, "--data-rate", "s3=nan"], "invalid --data-rate 's3=nan': expected a finite number"),
    ([*BASE, "--data-rate", "s3=-5"], "invalid --data-rate 's3=-5': must be more than 0"),
    # one compute rate: two of its sources are misuse, not a silent choice
    (["--gpu", "h100", "--tflops", "400", "--mfu", "0.5", "--ranks", "8", "--net", "ib=40GB/s"],
     "--tflops and --mfu both set the compute rate; give one"),
    ([*BASE, "--compute", "c.json", "--tflops", "400"], "--compute and --tflops both set the compute rate"),
    # past a sane bound a number is a typo, refused where it is parsed
    ([*BASE, "--seq-len", "99999999999999999999"], "invalid --seq-len '99999999999999999999': must be at most 16,777,216"),
    ([*BASE, "--micro-batch", "100000000"], "invalid --micro-batch '100000000': must be at most 65,536"),
    ([*BASE, "--grad-accum", "1e3"], "invalid --grad-accum '1e3': expected a positive whole number"),
    (["--gpu", "h100", "--net", "ib=40GB/s", "--nodes", "1000000"], "invalid --nodes '1000000': must be at most 100,000"),
    (["--params", "7e9", "--layers", "1000000000000", "--tflops", "400", "--ranks", "8", "--net", "ib=40GB/s"],
     "invalid --layers '1000000000000': must be at most 100,000"),
    ([*JOB, "--tier", "a=1:1", "--steps", "99999999999"], "invalid --steps '99999999999': must be at most 10,000,000"),
    ([*JOB, "--tier", "a=1:1", "--tokens", "1e30"], "invalid --tokens '1e30': must be at most"),
    ([*JOB, "--tier", "a=1:1", "--tokens", "1e15"], "--tokens 1e15 is 15,258,789,063 steps of 65,536 tokens"),
    ([*BASE, "--ckpt-every", "5"], "--ckpt-every describes a job: give its length too"),
    ([*BASE, "--tier", "a=1:1", "--state-dict", "full", "--save-format", "dcp"], "invalid --save-format 'dcp' with"),
])
def test_misuse_is_refused_before_any_output(capsys, tmp_path, argv, message):
    rc, out, err = compose(capsys, *argv, "--results-dir", str(tmp_path / "results"))
    assert rc == 2 and out == ""
    assert message in one_error_line(err)
    assert not (tmp_path / "results").exists()


def test_help_states_every_flags_default():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.choices and "compose" in a.choices).choices["compose"]
    flags = [a for a in sub._actions if a.option_strings and a.dest != "help"]
    assert len(flags) > 50
    missing = [a.option_strings[0] for a in flags if "(default" not in " ".join((a.help or "").split())]
    assert missing == []


def test_the_record_keeps_the_resolved_options(capsys, tmp_path):
    out = tmp_path / "c.json"
    assert main(["compose", *JOB, "--tier", "nvme=10:10,ephemeral", "--seq-len", "2048", "--steps", "20",
                 "--json", str(out)]) == 0
    options = json.loads(out.read_text())["config"]["options"]
    assert options["training"]["seq_len"] == 2048 and options["job"]["steps"] == 20
    assert options["storage"]["tier"][0]["name"] == "nvme" and options["storage"]["tier"][0]["durable"] is False
    assert options["output"] == {}          # where to write is not part of the prediction
    assert set(options) == {name for name, _ in sections.sections(ComposeOptions)}


def _nccl_record(busbw_at_4m: float) -> dict:
    rows = []
    for op in ("all_gather", "reduce_scatter"):
        for size in (1 << 20, 4 << 20, 16 << 20):
            t = 100e-6 + size * 0.5 / 1e9
            rows.append({"op": op, "size_bytes": size, "placement": "out", "ranks": 2, "time_us": {"p50": t * 1e6},
                         "algbw_gbps": size / t / 1e9, "busbw_gbps": size / t / 1e9 * 0.5})
    rows[1]["busbw_gbps"] = busbw_at_4m
    return {"schema_version": 1, "kind": "nccl", "status": "complete", "config": {"world": {"size": 2}},
            "environment": {}, "implementation": {"backend": "nccl", "device": "cuda"}, "rows": rows}


def test_compose_refuses_a_nan_busbw_row(cli, tmp_path):
    (tmp_path / "n.json").write_text(json.dumps(_nccl_record(float("nan"))))
    _refused(cli("compose", "--nccl", "n.json", *GPU, timeout=120),
             "'n.json' holds NaN at rows[1].busbw_gbps: every number in it must be finite")
    # The same record with a number there predicts: only the NaN was refused.
    (tmp_path / "ok.json").write_text(json.dumps(_nccl_record(1.0)))
    assert cli("compose", "--nccl", "ok.json", *GPU, "--json", "c.json", timeout=120).returncode == 0
