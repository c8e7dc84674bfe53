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

# What the backend itself allocates beyond our buffers, as a multiple of S, measured (VmHWM of
# 2 ranks, torch 2.13, S = 512 MiB): gloo's reduce_scatter_tensor clones its input and
# all-reduces the clone, its all_gather_into_tensor gathers into a flat temporary and copies out;
# gloo's all_reduce, broadcast and all_to_all_single work in our buffers. NCCL stages nothing
# that scales with S.
STAGING = {"gloo": {"reduce_scatter": 1.0, "all_gather": 1.0}}
# A rank's interpreter, torch and the backend before any buffer (measured: 0.49 GiB for the
# launcher and 2 ranks at --sizes 1M).
PROCESS_BYTES = 256 << 20


def op_bytes_per_rank(name: str, size_bytes: int, n: int, backend: str = "gloo") -> int:
    """Peak bytes one rank holds while `name` runs at size_bytes: our buffers (sized for the op's
    largest case; the previous op's are freed before the next op's are made, see _buffer), the
    backend's staging copy, and the process itself. The check allocates nothing (count_wrong
    compares in place)."""
    share = OPS[name].footprint(n) + STAGING.get(backend, {}).get(name, 0.0)
    return int(share * size_bytes) + PROCESS_BYTES


def bytes_needed_per_rank(ops: list[str], size_bytes: int, n: int, backend: str = "gloo") -> int:
    """Peak bytes one rank holds for the largest case: the largest op's, since ops run one at a
    time and each frees its buffers before the next allocates."""
    return max(op_bytes_per_rank(name, size_bytes, n, backend) for name in ops)


def check_memory(ops: list[str], sizes: list[int], ranks_here: int, free_bytes: int, where: str,
                 backend: str | None = None) -> None:
    # Without a backend named: host memory is a CPU world's (gloo), GPU memory NCCL's.
    backend = backend or ("nccl" if where.startswith("GPU") else "gloo")
    n = max(ranks_here, 1)
    need = bytes_needed_per_rank(ops, max(sizes), n, backend) * ranks_here
    shortfall = memory_shortfall(need, free_bytes, f"{where} for {ranks_here} rank(s) here")
    if shortfall:
        per_op = ", ".join(f"{name} {format_bytes_human(op_bytes_per_rank(name, max(sizes), n, backend))}" for name in ops)
        fits = [name for name in ops if op_bytes_per_rank(name, max(sizes), n, backend) * ranks_here
                <= free_bytes * MEMORY_SHARE]
        other = f" or only --ops {','.join(fits)}" if fits else ""
        raise UsageError(f"--sizes up to {format_bytes_human(max(sizes))} {shortfall}; per rank: {per_op}; "
                         f"use a smaller maximum, e.g. --sizes 1M-{_suggest(free_bytes, ops, ranks_here, backend)}"
                         f"{other}")


def _suggest(free_bytes: int, ops: list[str], ranks_here: int, backend: str = "gloo") -> str:
    size = 1 << 20
    while bytes_needed_per_rank(ops, size * 2, max(ranks_here, 1), backend) * ranks_here < free_bytes * MEMORY_SHARE:
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
