"""Which sizes and placements of a collective sweep fit in memory, planned before the sweep.

A rank holds, for the op it runs: its buffers, allocated once per op and role at the largest
case that uses them (the probe's arenas, see CollectiveProbe._buffer), the backend's staging
copy at the case's size (ops.STAGING), and the process. Out of place needs more than in place:
reduce_scatter's separate output chunk, all_gather's separate input chunk. So a request whose
largest out-of-place case does not fit often fits in place (the 24 GiB VM's 4G: 20.5 GiB out of
place against 20.3 GiB allowed, 16.5 GiB in place).

plan_memory keeps every case it can: per op, the cases in the order of what each needs alone,
each kept while the op's peak with it still fits in the share of free memory a run may take
(units.MEMORY_SHARE). The others are skipped, each with the memory running it would need; only a
request of which nothing fits is refused (exit 2), before any work.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...core.errors import UsageError
from ...core.units import MEMORY_SHARE, format_bytes_human, format_size_exact
from .ops import OPS, PROCESS_BYTES, STAGING

PLACEMENT_WORDS = {"out": "out-of-place", "in": "in-place"}


def role_bytes(name: str, size_bytes: int, n: int, placement: str) -> dict[str, int]:
    """The buffers one case makes, by role (CollOp.buffers: in place one buffer, the larger
    side's): what the arenas must hold."""
    c = OPS[name].counts(size_bytes, max(n, 1))
    if placement == "in":
        return {"recv" if c.recv > c.send else "send": max(c.send, c.recv)}
    return {"send": c.send, "recv": c.recv}


def op_peak_bytes(name: str, cases: list[tuple[int, str]], n: int, backend: str,
                  process_bytes: int = PROCESS_BYTES) -> int:
    """One rank's peak while `name` runs these (size, placement) cases: each role's arena at its
    largest case, the staging copy of the largest size, the process."""
    arenas: dict[str, int] = {}
    for size, placement in cases:
        for role, nbytes in role_bytes(name, size, n, placement).items():
            arenas[role] = max(arenas.get(role, 0), nbytes)
    staging = STAGING.get(backend, {}).get(name, 0.0) * max((size for size, _ in cases), default=0)
    return sum(arenas.values()) + int(staging) + process_bytes


def op_bytes_per_rank(name: str, size_bytes: int, n: int, backend: str = "gloo") -> int:
    """Peak bytes one rank holds while `name` runs every placement at size_bytes."""
    return op_peak_bytes(name, [(size_bytes, p) for p in OPS[name].placements], n, backend)


def bytes_needed_per_rank(ops: list[str], size_bytes: int, n: int, backend: str = "gloo") -> int:
    """Peak bytes one rank holds for a sweep up to size_bytes: the largest op's, since ops run
    one at a time and each frees its buffers before the next allocates."""
    return max(op_bytes_per_rank(name, size_bytes, n, backend) for name in ops)


@dataclass(frozen=True)
class Skipped:
    op: str
    size_bytes: int        # the size as requested (--sizes), before rounding to whole chunks
    placement: str
    need_bytes: int        # the op's peak with this case, over the ranks that share the memory

    def to_dict(self) -> dict[str, Any]:
        return {"op": self.op, "size_bytes": self.size_bytes, "placement": self.placement,
                "need_bytes": self.need_bytes}

    def words(self) -> str:
        return (f"{self.op} {PLACEMENT_WORDS.get(self.placement, self.placement)} "
                f"{format_size_exact(self.size_bytes)} needs {format_bytes_human(self.need_bytes)}")


@dataclass
class MemoryPlan:
    where: str                     # "host memory for 2 rank(s)", "GPU memory of rank 1"
    free_bytes: int
    cases: int                     # (op, size, placement) requested
    skipped: list[Skipped] = field(default_factory=list)

    @property
    def allowed_bytes(self) -> float:
        return self.free_bytes * MEMORY_SHARE

    def skips(self, op: str, size_bytes: int, placement: str) -> bool:
        return any(s.op == op and s.size_bytes == size_bytes and s.placement == placement for s in self.skipped)

    def why(self) -> str:
        return (f"{format_bytes_human(self.allowed_bytes)} of {self.where} may be taken "
                f"({MEMORY_SHARE:.0%} of the {format_bytes_human(self.free_bytes)} free)")



def plan_memory(ops: list[str], sizes: list[int], ranks_here: int, free_bytes: int, where: str,
                backend: str | None = None, process_bytes: int = PROCESS_BYTES, world: int | None = None) -> MemoryPlan:
    """The cases to run and to skip (module docstring); UsageError when none fits. `ranks_here`
    ranks share `free_bytes` (a host's CPU ranks; 1 for a rank's own GPU); `world`: the ranks a
    collective spans, which sets its chunk (S/world), default `ranks_here`."""
    backend = backend or ("nccl" if where.startswith("GPU") else "gloo")
    n = max(world or ranks_here, 1)
    plan = MemoryPlan(f"{where} for {ranks_here} rank(s)" if ranks_here > 1 else where, free_bytes, 0)
    for name in ops:
        candidates = [(size, placement) for size in sizes for placement in OPS[name].placements]
        plan.cases += len(candidates)
        kept: list[tuple[int, str]] = []
        alone = {case: op_peak_bytes(name, [case], n, backend, process_bytes) for case in candidates}
        for case in sorted(candidates, key=lambda case: (alone[case], case[0], case[1] != "in")):
            need = op_peak_bytes(name, kept + [case], n, backend, process_bytes) * ranks_here
            if need <= plan.allowed_bytes:
                kept.append(case)
            else:
                plan.skipped.append(Skipped(name, case[0], case[1], need))
    plan.skipped.sort(key=lambda s: (ops.index(s.op), s.size_bytes, s.placement != "out"))
    if len(plan.skipped) == plan.cases:
        smallest = min(plan.skipped, key=lambda s: s.need_bytes)
        largest = _largest_fitting(ops, ranks_here, n, plan.allowed_bytes, backend, process_bytes)
        hint = f"e.g. --sizes 1M-{format_size_exact(largest)}" if largest else "fewer ranks"
        raise UsageError(f"no size of --sizes fits in {plan.where}: the smallest case, {smallest.words()}, more "
                         f"than the {plan.why()}; use {hint}")
    return plan


def _largest_fitting(ops: list[str], ranks_here: int, n: int, allowed: float, backend: str,
                     process_bytes: int) -> int | None:
    """The largest power-of-two size from 1M at which every op's every placement fits."""
    size, found = 1 << 20, None
    while size <= 1 << 50 and all(
            op_peak_bytes(name, [(size, p) for p in OPS[name].placements], n, backend,
                          process_bytes) * ranks_here <= allowed for name in ops):
        found, size = size, size * 2
    return found
