"""A TrainSpec whose compute is priced per kernel: the one place compose and the benchmarks turn
a training configuration and a GPU's rates into the per-unit times the FSDP step overlaps."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ...core.units import DTYPE_BYTES
from ..fsdp import TrainSpec, checkpointing
from .pricing import Rates, StepCompute, price_step


def priced_compute(model: Any, train: TrainSpec, rates: Rates) -> StepCompute:
    return price_step(model, train.micro_batch, train.seq_len, train.grad_accum, checkpointing(train), rates,
                      param_bytes=DTYPE_BYTES[train.param_dtype], reduce_bytes=DTYPE_BYTES[train.reduce_dtype],
                      reshard=train.reshard_after_forward)


def priced_train(model: Any, train: TrainSpec, rates: Rates, scale: float = 1.0) -> TrainSpec:
    """`train` with its compute priced per kernel at `rates`, every rate times `scale`."""
    return replace(train, kernel_compute=priced_compute(model, train, rates), compute_scale=scale)
