"""A TrainSpec whose compute is priced per kernel: the one place compose and the benchmarks turn
a training configuration and a GPU's rates into the per-unit times the FSDP step overlaps."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ...core.units import DTYPE_BYTES
from ..fsdp import TrainSpec, checkpointing
from .pricing import Rates, StepCompute, TableRates, price_step


def priced_compute(model: Any, train: TrainSpec, rates: Rates) -> StepCompute:
    return price_step(model, train.micro_batch, train.seq_len, train.grad_accum, checkpointing(train), rates,
                      param_bytes=DTYPE_BYTES[train.param_dtype], reduce_bytes=DTYPE_BYTES[train.reduce_dtype],
                      reshard=train.reshard_after_forward, loss=train.loss_kernel, precision=train.precision,
                      attention_call=train.attention_call, early_stop=train.recompute_early_stop,
                      counted_ops=train.counted_ops)


def priced_train(model: Any, train: TrainSpec, rates: Rates, scale: float = 1.0) -> TrainSpec:
    """`train` with its compute priced per kernel at `rates`, every rate times `scale`."""
    return replace(train, kernel_compute=priced_compute(model, train, rates), compute_scale=scale)


def select_rates(gpu: Any, *, tflops: float | None = None, mfu: float | None = None,
                 record_rows: list[dict[str, Any]] | None = None, record_path: str = "",
                 attention_impl: str | None = None, table: Any = None) -> tuple[Rates | None, Any]:
    """The rates compose prices kernels at, in the issue's order, and the table behind them (or
    None): a compute record's rows (falling back to the table), else the shipped table for the
    GPU; with --tflops, or a GPU without a table, one FLOP rate (peak x mfu) with memory-bound work
    at the GPU's bandwidth x the H100 copy fraction. (None, None) without a GPU: the single-rate
    composer stays in charge (a CPU's own compute record predicts that CPU). `attention_impl`
    picks the table's attention implementation (None: its default; one it lacks is priced at
    the default, the source saying so); `table` one the user measured (--kernel-table), instead of
    the shipped one. An --mfu given on a GPU with a table prices every kernel at it, as --tflops."""
    from .measured import RecordRates
    from .pricing import FlatRates
    from .tables import shipped

    if gpu is None:
        return None, None
    table = table if table is not None else shipped(gpu.name)
    fallback = table if table is not None else shipped("h100")
    assert fallback is not None   # the h100 table ships with the package
    fraction = fallback.memory_fraction
    memory = (gpu.memory_gbps * fraction * 1e9, f"{gpu.name} bandwidth x {fraction:.3g}")
    if tflops is not None:
        return FlatRates(tflops * 1e12, f"--tflops {tflops:g}", *memory), None
    if mfu is not None and table is not None:
        return FlatRates(gpu.peak_bf16_tflops * mfu * 1e12,
                         f"{gpu.name} peak {gpu.peak_bf16_tflops:g} TFLOP/s x --mfu {mfu:g}", *memory), None
    base: Rates
    if table is not None:
        base = TableRates(table, gpu.memory_gbps, attention_impl)
    else:
        share = 0.4 if mfu is None else mfu
        base = FlatRates(gpu.peak_bf16_tflops * share * 1e12,
                         f"no kernel table for {gpu.name}: peak {gpu.peak_bf16_tflops:g} TFLOP/s x MFU {share:g}",
                         *memory)
    if record_rows:
        return RecordRates(record_rows, record_path, base), table
    return base, table


def overlap_loss(table: Any, nodes: int) -> float:
    """The share of its rate compute loses while a collective runs beside it (TrainSpec's
    contention): from the GPU's table, one node or across nodes; 0 without a table entry."""
    if table is None:
        return 0.0
    return 1.0 - table.overlap_rate(nodes > 1)


def priced_for(model: Any, train: TrainSpec, gpu: Any, nodes: int, *, tflops: float | None = None,
               mfu: float | None = None, record_rows: list[dict[str, Any]] | None = None, record_path: str = "",
               attention_impl: str | None = None, table: Any = None,
               scale: float = 1.0) -> tuple[TrainSpec, Rates | None, Any]:
    """`train` priced per kernel for this GPU, as compose prices it (and the published-runs check
    through the same call): the rates in select_rates' order, compute slowed beside collectives as
    the GPU's table says (one node or across nodes), every rate times `scale`. A model without
    shapes (--params/--layers) or no GPU: `train` unchanged, (rates, table) None."""
    rates, table = select_rates(gpu, tflops=tflops, mfu=mfu, record_rows=record_rows, record_path=record_path,
                                attention_impl=attention_impl, table=table)
    if rates is None or not hasattr(model, "heads"):
        return train, None, None
    train = replace(train, contention=overlap_loss(table, nodes))
    return priced_train(model, train, rates, scale), rates, table
