"""The collectives, one entry each (nccl-tests keeps a struct of hooks per collective; ours are
short enough to share one table): what each reduces, where its root is, which placements it
has, and what the backend stages beside a rank's buffers (the buffers and the plan of what fits
in memory: plan.py). Every list of op names comes from here."""

from __future__ import annotations

from dataclasses import dataclass

from ...core.errors import UsageError
from ...core.units import bus_factor


@dataclass(frozen=True)
class CollOp:
    name: str
    redop: str                       # "sum", or "none" for data movement
    root: int                        # -1 where the op has no root
    placements: tuple[str, ...]      # "out" (out-of-place) and/or "in" (in-place)
    chunked: bool                    # S must split into n equal chunks

    def factor(self, n: int) -> float:
        """busbw / algbw for n ranks."""
        return bus_factor(self.name, n)


OPS: dict[str, CollOp] = {
    "reduce_scatter": CollOp("reduce_scatter", "sum", -1, ("out", "in"), True),
    "all_gather": CollOp("all_gather", "none", -1, ("out", "in"), True),
    # torch.distributed.all_reduce and broadcast work in place only: no out-of-place column.
    "all_reduce": CollOp("all_reduce", "sum", -1, ("in",), False),
    "broadcast": CollOp("broadcast", "none", 0, ("in",), False),
    "all_to_all": CollOp("all_to_all", "none", -1, ("out",), True),
}
DEFAULT_OPS = ("reduce_scatter", "all_gather", "all_reduce")   # the ones FSDP uses
# microbench's own rings over send/recv (--algo ring) exist for these
RING_OPS = ("reduce_scatter", "all_gather", "all_reduce")
ALGOS = ("torch", "ring")


def effective_size(op: CollOp, size_bytes: int, n: int, elem: int, chunked: bool | None = None) -> int:
    """Round down so the buffer splits into whole elements (and n equal chunks where needed)."""
    unit = elem * (n if (op.chunked if chunked is None else chunked) else 1)
    return max(unit, size_bytes // unit * unit)


# --------------------------------------------------------------------------- memory a sweep needs
# (what a rank holds for each case, and the plan of what fits: plan.py)

# What the backend itself allocates beyond our buffers, as a multiple of S, measured (VmHWM of
# 2 ranks, torch 2.13, S = 512 MiB): gloo's reduce_scatter_tensor clones its input and
# all-reduces the clone, its all_gather_into_tensor gathers into a flat temporary and copies out;
# gloo's all_reduce, broadcast and all_to_all_single work in our buffers. NCCL stages nothing
# that scales with S.
STAGING = {"gloo": {"reduce_scatter": 1.0, "all_gather": 1.0}}
# A rank's interpreter, torch and the backend before any buffer (measured: 0.49 GiB for the
# launcher and 2 ranks at --sizes 1M).
PROCESS_BYTES = 256 << 20


def check_algo(algo: str, ops: list[str]) -> None:
    if algo not in ALGOS:
        raise UsageError(f"invalid --algo {algo!r}: expected one of {', '.join(ALGOS)} (e.g. --algo ring)")
    if algo == "ring":
        other = [op for op in ops if op not in RING_OPS]
        if other:
            raise UsageError(f"--algo ring covers {', '.join(RING_OPS)}, not {', '.join(other)}; "
                             f"e.g. --algo ring --ops {','.join(RING_OPS)}")
