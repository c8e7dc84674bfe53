"""The collectives, one entry each (nccl-tests keeps a struct of hooks per collective; ours are
short enough to share one table): what each reduces, where its root is, which placements it
has, and how many bytes a rank holds for it. Every list of op names comes from here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ...core.errors import UsageError
from ...core.units import MEMORY_SHARE, bus_factor, format_bytes_human, format_size, memory_shortfall


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
DEFAULT_OPS = ("reduce_scatter", "all_gather", "all_reduce")   # the ones FSDP uses
# microbench's own rings over send/recv (--algo ring) exist for these
RING_OPS = ("reduce_scatter", "all_gather", "all_reduce")
ALGOS = ("torch", "ring")


# --------------------------------------------------------------------------- memory a sweep needs

def bytes_needed_per_rank(ops: list[str], size_bytes: int, n: int) -> int:
    """Peak bytes one rank holds for the largest case: the op's buffers plus one buffer of
    expected values for the check."""
    return int(max(OPS[name].footprint(n) for name in ops) * size_bytes + size_bytes)


def check_memory(ops: list[str], sizes: list[int], ranks_here: int, free_bytes: int, where: str) -> None:
    need = bytes_needed_per_rank(ops, max(sizes), max(ranks_here, 1)) * ranks_here
    shortfall = memory_shortfall(need, free_bytes, f"{where} for {ranks_here} rank(s) here")
    if shortfall:
        raise UsageError(f"--sizes up to {format_bytes_human(max(sizes))} {shortfall}; "
                         f"use a smaller maximum, e.g. --sizes 1M-{_suggest(free_bytes, ops, ranks_here)}")


def _suggest(free_bytes: int, ops: list[str], ranks_here: int) -> str:
    size = 1 << 20
    while bytes_needed_per_rank(ops, size * 2, max(ranks_here, 1)) * ranks_here < free_bytes * MEMORY_SHARE:
        size *= 2
    return format_size(size)


def check_algo(algo: str, ops: list[str]) -> None:
    if algo not in ALGOS:
        raise UsageError(f"invalid --algo {algo!r}: expected one of {', '.join(ALGOS)} (e.g. --algo ring)")
    if algo == "ring":
        other = [op for op in ops if op not in RING_OPS]
        if other:
            raise UsageError(f"--algo ring covers {', '.join(RING_OPS)}, not {', '.join(other)}; "
                             f"e.g. --algo ring --ops {','.join(RING_OPS)}")
