"""The compute table prints each kernel's rate to three significant digits: on a CPU a matmul at
0.00318 TFLOP/s and a norm at 0.048 GB/s used to read "0.00 TFLOP/s" and "0.0 GB/s"."""

from __future__ import annotations

from types import SimpleNamespace

from microbench.probes.compute import print_report


def test_small_rates_keep_their_significant_digits(capsys):
    rows = [{"op": "k", "cls": "matmul", "m": 2048, "n": 128, "k": 256, "time_us": {"p50": 42300.0},
             "tflops": 0.00318, "per_block": 1},
            {"op": "norm", "cls": "memory", "bytes": 2.1e6, "time_us": {"p50": 43700.0}, "gbps": 0.048, "per_block": 2.25}]
    outcome = SimpleNamespace(rows=rows, path="c.json", record={"implementation": {"library": "CPU BLAS"},
                                                 "summary": {"achieved_tflops": 0.00318}})
    config = SimpleNamespace(micro_batch=None, model="tiny", tokens=2048, dtype="float32", device="cpu",
                             why_cpu=None, tokens_given=True)
    print_report(outcome, config)
    out = capsys.readouterr().out
    assert "0.00318 TFLOP/s" in out and "0.048 GB/s" in out
    assert "0.00 TFLOP/s" not in out and "0.0 GB/s" not in out
