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


def compute_lines(train: Any, table: Any, rates: Any, format_time: Callable[[float], str], *, model: str = "",
                  measured: Any = None, scale_from: str | None = None) -> list[str]:
    """What compose prints of compute priced per kernel: the breakdown, where each class's rates
    and the memory-bound bytes came from, a compute record's other shapes (and the command that
    measures them), the scale a measured step gave or a calibration applied."""
    from tabulate import tabulate

    from .measured import RecordRates, shapes_line

    compute, scale = train.kernel_compute, train.compute_scale
    headers, rows = breakdown_table(compute, scale, format_time)
    out = [
        f"\n## compute per kernel class (one optimizer step, one rank; checkpointing {compute.checkpointing}, "
        f"gradient sync {'every micro-batch' if train.sync_every_microbatch else 'deferred to the last micro-batch'})",
        tabulate(rows, headers=headers, tablefmt="simple", disable_numparse=True),
    ]
    out += [f"# {line}" for line in sources_lines(table)]
    out.append(f"# {bytes_line(compute)}")
    if isinstance(rates, RecordRates):
        line = shapes_line(rates, model, train.micro_batch, train.seq_len, compute.checkpointing)
        if line:
            out.append(f"# {line}")
    if measured is not None:
        out.append(f"# measured step {measured.measured_step_s:g} s on this configuration: every compute rate x "
                   f"{measured.scale:.3g} reproduces it (unscaled {format_time(measured.predicted_unscaled_s)}); the "
                   f"record keeps it (summary.calibration) for --calibration on other configurations")
    elif scale_from:
        out.append(f"# compute rates x {scale:.3g}, the scale --calibration {scale_from} measured "
                   f"(communication is not scaled)")
    return out
