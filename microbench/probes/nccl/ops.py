"""The collectives, one entry each, with their behaviour as nccl-tests' `struct testColl` has it
(one file per collective behind the struct there; ours are short enough to share one table):

  counts    the buffers of one case on one rank (getCollByteCount): send and receive elements,
            and in place where each view lies in the one buffer;
  expected  what the receive buffer must hold afterwards (initData's expected values), as
            segments of the repeating pattern;
  run       the call itself (runColl), bound once to a process group: torch's collective, or
            microbench's ring over send/recv where it has one;
  factor    busbw / algbw (getBw), nccl-tests' factors, shared with the composer (units.bus_factor);
plus what the sweep needs: the reduction, the root, the placements torch offers, and whether S
splits into n chunks. The memory a case needs follows from `counts` (plan.py).

A new collective is one entry in OPS; every list of op names comes from here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ...core.errors import UsageError
from ...core.units import bus_factor

# (start, length, tile): elements start..start+length-1 of the receive buffer must equal
# tile[k mod 3] (probes/nccl/pattern.py says why three values suffice).
Segment = tuple[int, int, tuple[int, int, int]]
Call = Callable[[Any, Any], None]  # (send, recv): one run of the collective on this rank


@dataclass(frozen=True)
class Counts:
    """One case's buffers on one rank, in elements (nccl-tests' getCollByteCount). In place the
    op works in one buffer: its send view starts at send_in_place x rank, its receive view at
    recv_in_place x rank."""

    send: int
    recv: int
    send_in_place: int = 0
    recv_in_place: int = 0


def tile(first: int, ranks: range | list[int]) -> tuple[int, int, int]:
    """Three consecutive expected values from element `first` on: the sum of `ranks`' patterns
    (rank r's element i is ((i + r) mod 3) - 1)."""
    vals = [sum((first + j + r) % 3 - 1 for r in ranks) for j in range(3)]
    return vals[0], vals[1], vals[2]


@dataclass(frozen=True)
class CollOp:
    name: str
    redop: str  # "sum", or "none" for data movement
    root: int  # -1 where the op has no root
    placements: tuple[str, ...]  # "out" (out-of-place) and/or "in" (in-place)
    chunked: bool  # S must split into n equal chunks
    counts: Callable[[int, int], Counts]  # (count, n)
    expected: Callable[[int, int, int], list[Segment]]  # (count, n, rank): the receive buffer
    torch_call: Callable[[Any, Any, int], Call]  # (torch.distributed, group, root's global rank)
    ring_call: Callable[[Any], Call] | None = None  # (a ring.Ring): microbench's own, --algo ring
    # The receive buffer is zeroed before each case: a gathered chunk that never arrives then
    # reads as wrong instead of as the previous case's values in the same arena.
    zero_recv: bool = False
    # Placements whose timed runs feed their output back as the next run's input (in-place
    # reductions): the check refills the buffers and runs once more.
    feeds_back: tuple[str, ...] = ()

    def factor(self, n: int) -> float:
        """busbw / algbw for n ranks."""
        return bus_factor(self.name, n)

    def effective_size(self, size_bytes: int, n: int, elem: int, chunked: bool | None = None) -> int:
        """Round down so the buffer splits into whole elements (and n equal chunks where needed)."""
        unit = elem * (n if (self.chunked if chunked is None else chunked) else 1)
        return max(unit, size_bytes // unit * unit)

    def buffers(
        self, arena: Callable[[str, int], Any], count: int, n: int, rank: int, placement: str
    ) -> tuple[Any, Any]:
        """(send, recv) views of this rank's arena (`arena(role, elements)`), the send view filled
        with this rank's pattern. In place the op's one buffer is its larger side's ("send" on a tie)."""
        from .pattern import fill_pattern

        c = self.counts(count, n)
        if placement == "in":
            role = "recv" if c.recv > c.send else "send"
            whole = arena(role, max(c.send, c.recv))
            if self.zero_recv:
                whole.zero_()
            send = whole[c.send_in_place * rank : c.send_in_place * rank + c.send]
            recv = whole[c.recv_in_place * rank : c.recv_in_place * rank + c.recv]
        else:
            recv = arena("recv", c.recv)
            if self.zero_recv:
                recv.zero_()
            send = arena("send", c.send)
        fill_pattern(send, rank)
        return send, recv


def _same(count: int, n: int) -> Counts:
    return Counts(count, count)


def _scatter(count: int, n: int) -> Counts:
    chunk = count // n
    return Counts(count, chunk, 0, chunk)


def _gather(count: int, n: int) -> Counts:
    chunk = count // n
    return Counts(chunk, count, chunk, 0)


def _rs_call(dist: Any, pg: Any, root: int) -> Call:
    from ...world import collectives

    reduce_scatter = collectives.reduce_scatter(dist)
    return lambda send, recv: reduce_scatter(recv, send, group=pg)


def _ag_call(dist: Any, pg: Any, root: int) -> Call:
    from ...world import collectives

    all_gather = collectives.all_gather(dist)
    return lambda send, recv: all_gather(recv, send, group=pg)


BROADCAST_ROOT = 0  # the group rank whose buffer a broadcast sends

# Sums: whole cycles of three ranks add up to zero, so only the first n mod 3 ranks' patterns
# remain. Chunked ops hold count // n elements per rank.
OPS: dict[str, CollOp] = {
    op.name: op
    for op in (
        CollOp(
            "reduce_scatter",
            "sum",
            -1,
            ("out", "in"),
            True,
            _scatter,
            lambda count, n, rank: [(0, count // n, tile(rank * (count // n), range(n % 3)))],
            _rs_call,
            lambda ring: lambda send, recv: ring.reduce_scatter(recv, send),
            feeds_back=("in",),
        ),
        CollOp(
            "all_gather",
            "none",
            -1,
            ("out", "in"),
            True,
            _gather,
            lambda count, n, rank: [(r * (count // n), count // n, tile(0, [r])) for r in range(n)],
            _ag_call,
            lambda ring: lambda send, recv: ring.all_gather(recv, send),
            zero_recv=True,
        ),
        # torch.distributed.all_reduce and broadcast work in place only: no out-of-place column.
        CollOp(
            "all_reduce",
            "sum",
            -1,
            ("in",),
            False,
            _same,
            lambda count, n, rank: [(0, count, tile(0, range(n % 3)))],
            lambda dist, pg, root: lambda send, recv: dist.all_reduce(recv, group=pg),
            lambda ring: lambda send, recv: ring.all_reduce(recv),
            feeds_back=("in",),
        ),
        CollOp(
            "broadcast",
            "none",
            BROADCAST_ROOT,
            ("in",),
            False,
            _same,
            lambda count, n, rank: [(0, count, tile(0, [BROADCAST_ROOT]))],
            lambda dist, pg, root: lambda send, recv: dist.broadcast(recv, src=root, group=pg),
        ),
        CollOp(
            "all_to_all",
            "none",
            -1,
            ("out",),
            True,
            _same,
            lambda count, n, rank: [(r * (count // n), count // n, tile(rank * (count // n), [r])) for r in range(n)],
            lambda dist, pg, root: lambda send, recv: dist.all_to_all_single(recv, send, group=pg),
        ),
    )
}
DEFAULT_OPS = ("reduce_scatter", "all_gather", "all_reduce")  # the ones FSDP uses
# microbench's own rings over send/recv (--algo ring) exist for these
RING_OPS = tuple(name for name, op in OPS.items() if op.ring_call is not None)
ALGOS = ("torch", "ring")


def op_named(name: str) -> CollOp:
    op = OPS.get(name)
    if op is None:
        raise UsageError(f"unknown op {name!r}: expected one of {', '.join(OPS)}")
    return op


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


def effective_size(op: CollOp, size_bytes: int, n: int, elem: int, chunked: bool | None = None) -> int:
    """Round down so the buffer splits into whole elements (and n equal chunks where needed)."""
    return op.effective_size(size_bytes, n, elem, chunked)


def check_algo(algo: str, ops: list[str]) -> None:
    if algo not in ALGOS:
        raise UsageError(f"invalid --algo {algo!r}: expected one of {', '.join(ALGOS)} (e.g. --algo ring)")
    if algo == "ring":
        other = [op for op in ops if op not in RING_OPS]
        if other:
            raise UsageError(
                f"--algo ring covers {', '.join(RING_OPS)}, not {', '.join(other)}; "
                f"e.g. --algo ring --ops {','.join(RING_OPS)}"
            )
