"""The collectives the probe runs: one small CollOp entry each (nccl-tests keeps one file per
collective behind a struct; ours are short enough to share one table)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ...core.units import bus_factor


@dataclass(frozen=True)
class CollOp:
    name: str
    redop: str                       # "sum", or "none" for data movement
    root: int                        # -1 where the op has no root
    placements: tuple[str, ...]      # "out" (out-of-place) and/or "in" (in-place)
    chunked: bool                    # S must split into n equal chunks
    # (per-rank bytes held for the op) as a multiple of S, for the memory check
    footprint: Callable[[int], float]

    def factor(self, n: int) -> float:
        """busbw / algbw for n ranks."""
        return bus_factor(self.name, n)


OPS: dict[str, CollOp] = {
    "reduce_scatter": CollOp("reduce_scatter", "sum", -1, ("out", "in"), True, lambda n: 1 + 1 / n),
    "all_gather": CollOp("all_gather", "none", -1, ("out", "in"), True, lambda n: 1 + 1 / n),
    # torch.distributed.all_reduce and broadcast work in place only: no out-of-place column.
    "all_reduce": CollOp("all_reduce", "sum", -1, ("in",), False, lambda n: 1.0),
    "broadcast": CollOp("broadcast", "none", 0, ("in",), False, lambda n: 1.0),
    "all_to_all": CollOp("all_to_all", "none", -1, ("out",), True, lambda n: 2.0),
}
DEFAULT_OPS = ("reduce_scatter", "all_gather", "all_reduce")
