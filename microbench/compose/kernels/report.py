"""The per-kernel-class breakdown compose prints under the step table: per class and pass, the
time one step spends, its FLOPs or bytes, the rate used and where that rate came from."""

from __future__ import annotations

from typing import Any, Callable

from .pricing import StepCompute


def _num(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def _work(row: Any) -> str:
    if row.cls in ("matmul", "attention"):
        return f"{_num(row.flops / 1e12)} TFLOP"
    return f"{_num(row.bytes / 1e9)} GB"


def _rate(row: Any, scale: float) -> str:
    if row.time_s <= 0:
        return "-"
    if row.cls in ("matmul", "attention"):
        return f"{_num(row.rate * scale / 1e12)} TFLOP/s"
    return f"{_num(row.rate * scale / 1e9)} GB/s"


def breakdown_table(compute: StepCompute, scale: float,
                    format_time: Callable[[float], str]) -> tuple[list[str], list[list[str]]]:
    """(headers, rows) for one optimizer step on one rank: times and rates with the calibration's
    scale applied (every row's time / scale)."""
    headers = ["kernel class", "pass", "time per step", "FLOPs or bytes", "rate", "rate from"]
    rows = [[r.cls, r.pass_, format_time(r.time_s / scale), _work(r), _rate(r, scale),
             "; ".join(sorted(r.sources)) + (f" x scale {scale:.3g}" if scale != 1 else "")]
            for r in compute.rows]
    total = sum(r.time_s for r in compute.rows) / scale
    rows.append(["total compute", "", format_time(total), f"{_num(compute.flops_per_step / 1e12)} TFLOP", "", ""])
    return headers, rows


def bytes_line(compute: StepCompute) -> str:
    """Where the memory-bound kernels' bytes came from: the eager count (its signature) or the hand list."""
    parts = "; ".join(compute.memory_from) or "hand-listed"
    return (f"memory-bound bytes per unit: {parts} (counted: the aten ops eager PyTorch runs, "
            f"benchmarks/eager_ops.py; hand-listed: kernels/blocks.py's list, for a layout the count does not cover)")


def sources_lines(table: Any) -> list[str]:
    """Where each class's table values come from, for the lines under the breakdown."""
    if table is None:
        return []
    return [f"{cls} rates: {text}" for cls, text in table.sources.items()]
