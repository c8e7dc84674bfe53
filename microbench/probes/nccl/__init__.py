"""Collective bandwidth over torch.distributed (NCCL on GPUs, gloo on CPUs).

Each collective is a small `CollOp` entry (nccl-tests keeps one file per collective behind a
struct; ours are short enough to share one table). Sizes, bus bandwidth and in-place semantics
follow nccl-tests exactly, so numbers compare one to one:

  algbw = S / t.  busbw = algbw * factor(n), nccl-tests' factors (units.bus_factor, shared with
  the composer): AllReduce 2(n-1)/n; ReduceScatter, AllGather, AllToAll (n-1)/n; Broadcast 1.
  S is the largest buffer of the op: the full gathered buffer for AllGather, the full input for
  ReduceScatter, the per-rank buffer for AllReduce, AllToAll and Broadcast.

Correctness: rank r's element i holds ((i + r) mod 3) - 1. Every partial sum over at most 256
ranks is a small integer, exact in float32, bfloat16 and float16, so results are compared for
exact equality and #wrong counts mismatching elements.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from ...core.errors import UsageError
from ...core.probe import Case, Probe
from ...core.registry import Needs, ProbeSpec, SuiteStep, SweepDefaults
from ...core.units import DTYPES, MEMORY_SHARE, bus_factor, element_size, format_bytes_human, memory_shortfall
from ...results.schema import ProbeRow
from .config import Config, validate
from .run import print_outcome, run as run_command
from .ops import (ALGOS, DEFAULT_OPS, OPS, PROCESS_BYTES, RING_OPS, STAGING, CollOp, bytes_needed_per_rank,  # noqa: F401
                  check_algo, check_memory, op_bytes_per_rank)



class _NcclRequired(ProbeRow):
    placement: str                  # "out" (out-of-place) or "in" (in-place), as nccl-tests
    count: int                      # elements per rank buffer (size_bytes / element size)
    dtype: str
    redop: str                      # "sum", or "none" for data movement
    root: int                       # -1 where the op has no root
    ranks: int
    algbw_gbps: float               # size_bytes / time_us.p50
    busbw_gbps: float               # algbw_gbps x the op's bus factor (module docstring)


class NcclRow(_NcclRequired, total=False):
    busbw_pct_of_expected: float    # when this hardware's expectation is known
    group: str                      # world, node or cross (--groups); a record without it: world
    groups_at_once: int             # node and cross: how many such groups ran at once




def effective_size(op: CollOp, size_bytes: int, n: int, elem: int, chunked: bool | None = None) -> int:
    """Round down so the buffer splits into whole elements (and n equal chunks where needed)."""
    unit = elem * (n if (op.chunked if chunked is None else chunked) else 1)
    return max(unit, size_bytes // unit * unit)


def fill_pattern(buf: Any, rank: int, offset: int = 0) -> Any:
    """Write rank `rank`'s input elements offset..offset+len-1, ((i + rank) mod 3) - 1, into buf.

    Tiled from three values, in place: an int64 index for a 256M float32 buffer would need
    512 MiB and seconds of CPU on every prepare and check."""
    import torch

    start = offset + rank
    tile = torch.tensor([(start + j) % 3 - 1 for j in range(3)], dtype=buf.dtype, device=buf.device)
    return _fill_tiled(buf, tile)


def _fill_tiled(buf: Any, tile: Any) -> Any:
    count = buf.numel()
    full = count // 3 * 3
    if full:
        buf[:full].view(-1, 3).copy_(tile.expand(full // 3, 3))
    if count > full:
        buf[full:].copy_(tile[:count - full])
    return buf


def pattern(count: int, rank: int, offset: int = 0, *, dtype: Any = None, device: Any = "cpu") -> Any:
    """A new tensor holding rank `rank`'s input elements offset..offset+count-1 (see fill_pattern)."""
    import torch

    return fill_pattern(torch.empty(count, dtype=dtype, device=device), rank, offset)


def expected_segments(op: str, count: int, n: int, rank: int) -> list[tuple[int, int, tuple[int, int, int]]]:
    """What rank `rank`'s output buffer must hold after `op` over n ranks on the patterns, as
    (start, length, tile) segments: element start+k must equal tile[k mod 3].

    count is the op's element count (its size S over the element size); chunked ops use
    count // n per rank. Sums: whole cycles of three ranks add up to zero, so only the first
    n mod 3 ranks' patterns remain."""
    chunk = count // n

    def tile(first: int, ranks: range | list[int]) -> tuple[int, int, int]:
        vals = [sum((first + j + r) % 3 - 1 for r in ranks) for j in range(3)]
        return vals[0], vals[1], vals[2]

    if op == "all_reduce":
        return [(0, count, tile(0, range(n % 3)))]
    if op == "reduce_scatter":
        return [(0, chunk, tile(rank * chunk, range(n % 3)))]
    if op == "all_gather":
        return [(r * chunk, chunk, tile(0, [r])) for r in range(n)]
    if op == "all_to_all":
        return [(r * chunk, chunk, tile(rank * chunk, [r])) for r in range(n)]
    if op == "broadcast":
        return [(0, count, tile(0, [OPS["broadcast"].root]))]
    raise UsageError(f"unknown op {op!r}: expected one of {', '.join(OPS)}")


def expected_result(op: str, count: int, n: int, rank: int, *, dtype: Any = None, device: Any = "cpu") -> Any:
    """The expected output as a tensor (for tests and small checks; the probe compares
    segment by segment without building it)."""
    import torch

    segments = expected_segments(op, count, n, rank)
    out = torch.empty(sum(length for _, length, _ in segments), dtype=dtype, device=device)
    for start, length, values in segments:
        _fill_tiled(out[start:start + length], torch.tensor(values, dtype=dtype, device=device))
    return out


def count_wrong(got: Any, segments: list[tuple[int, int, tuple[int, int, int]]]) -> int:
    """Elements of `got` that differ from the expected segments. The common, correct case is
    one vectorized equality per segment against a broadcast tile, with nothing allocated."""
    import torch

    wrong = 0
    for start, length, values in segments:
        seg = got[start:start + length]
        tile = torch.tensor(values, dtype=got.dtype, device=got.device)
        full = length // 3 * 3
        head, tail = seg[:full].view(-1, 3), seg[full:]
        expected_head, expected_tail = tile.expand(full // 3, 3), tile[:length - full]
        if torch.equal(head, expected_head) and torch.equal(tail, expected_tail):
            continue
        wrong += int((head != tile).sum().item()) + int((tail != expected_tail).sum().item())
    return wrong


def cpu_threads_per_rank(torch: Any) -> int:
    """Give each rank of a CPU world its share of the cores and set it. torch's default, every
    core per rank, oversubscribes them: gloo's reduce_scatter clones and copies S and its
    all_gather copies out S with torch's threads, so 2 ranks x 2 threads on 2 cores fought over
    them and the probe measured 0.87-0.90x a bare loop with one thread per rank
    (benchmarks/nccl_overhead.py, docs/BENCHMARKS.md)."""
    import os

    from ...world.topology import machine_ranks

    local = machine_ranks()
    threads = max(1, (os.cpu_count() or 1) // max(local, 1))
    torch.set_num_threads(threads)
    return threads


class CollectiveProbe(Probe):
    name = "nccl"

    def __init__(self, config: Config, world: Any, transport: Callable[[], dict[str, Any]] | None = None):
        import torch
        import torch.distributed as dist

        for name in config.ops:
            if name not in OPS:
                raise UsageError(f"invalid --ops {name!r}: expected some of {', '.join(OPS)}")
        check_algo(config.algo, config.ops)
        self.config, self.world = config, world
        self._transport = transport  # asked vs really used; NCCL says which only after connecting
        self.torch, self.dist = torch, dist
        self.n, self.rank = world.size, world.rank
        # --groups: this rank's group of each kind (groups.py); without it, the world alone, and
        # rows still say group "world" so that both read alike.
        from ...world.topology import topology
        from .groups import WORLD, check_groups, make_groups

        names = list(config.groups or [WORLD])
        self.topology = None
        if names != [WORLD]:
            self.topology = topology(world.size)
            check_groups(names, self.topology)
        self.groups = make_groups(dist, names, world, self.topology)
        if self.topology is not None:
            # Each node's host, for `microbench fleet` to name a node whose own group was slow.
            from ...world.environment import host_label

            self.hosts = world.all_gather_object(host_label())[:: self.topology.ranks_per_node]
        self.dtype = getattr(torch, config.dtype)
        self.elem = element_size(config.dtype)
        self.device = torch.device(f"cuda:{torch.cuda.current_device()}" if config.device == "cuda" else "cpu")
        self.cpu_threads = cpu_threads_per_rank(torch) if self.device.type == "cpu" else None
        self._buffers: dict[str, Any] = {}
        # Like nccl-tests, allocate each op's buffers once at its largest size and reuse them
        # for every size and placement: re-faulting 256 MiB per case costs seconds of CPU.
        self._arena: dict[str, Any] = {}
        self._arena_op: str | None = None
        self._case_list: list[Case] | None = None
        # torch 2.13 renamed the tensor forms; older releases only have the *_tensor names.
        reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        for group in self.groups.values():
            pg = group.pg
            if config.algo == "ring":
                from .ring import Ring

                ring = Ring(dist, group.rank, group.size, peers=group.members)
                group.ops.update(reduce_scatter=ring.reduce_scatter, all_gather=ring.all_gather,
                                 all_reduce=ring.all_reduce)
            else:
                group.ops.update(reduce_scatter=lambda out, inp, pg=pg: reduce_scatter(out, inp, group=pg),
                                 all_gather=lambda out, inp, pg=pg: all_gather(out, inp, group=pg),
                                 all_reduce=lambda buf, pg=pg: dist.all_reduce(buf, group=pg))
            group.ops.update(all_to_all=lambda out, inp, pg=pg: dist.all_to_all_single(out, inp, group=pg),
                             broadcast=lambda buf, pg=pg, root=group.members[OPS["broadcast"].root]:
                             dist.broadcast(buf, src=root, group=pg))

    def implementation(self) -> dict[str, Any]:
        engine = (f"microbench ring over torch.distributed send/recv ({self.config.backend})"
                  if self.config.algo == "ring" else f"torch.distributed/{self.config.backend}")
        return {"engine": engine, "algo": self.config.algo, "backend": self.config.backend,
                "device": self.config.device,
                **({"cpu_threads_per_rank": self.cpu_threads} if self.cpu_threads else {}),
                **(self._transport() if self._transport else {})}

    def cases(self) -> list[Case]:
        out = []
        for name in self.config.ops:
            op = OPS[name]
            for group in self.groups.values():
                seen = set()
                for size in self.config.sizes:
                    size = effective_size(op, size, group.size, self.elem,
                                          chunked=op.chunked or self.config.algo == "ring")
                    if size in seen:
                        continue
                    seen.add(size)
                    for placement in op.placements:
                        out.append(Case(name, size, (("placement", placement), ("group", group.name))))
        return out

    def _group(self, case: Case) -> Any:
        return self.groups[case.param("group") or "world"]

    def row_fields(self, case: Case) -> dict[str, Any]:
        op, group = OPS[case.op], self._group(case)
        return {"count": case.size_bytes // self.elem, "dtype": self.config.dtype, "redop": op.redop,
                "root": op.root, "ranks": group.size,
                # How many groups of this kind ran at once (node: one per node; cross: one per local rank).
                **({"groups_at_once": group.concurrent} if group.name != "world" else {})}

    # ------------------------------------------------------------------ buffers and the op
    def _pattern(self, count: int, rank: int, offset: int = 0) -> Any:
        return pattern(count, rank, offset, dtype=self.dtype, device=self.device)

    def _buffer(self, case: Case, role: str, count: int) -> Any:
        """A `count`-element view of this op's `role` arena, sized for the op's largest case."""
        if self._arena_op != case.op:
            self._arena, self._arena_op = {}, case.op  # free the previous op's buffers first
        buf = self._arena.get(role)
        if buf is None or buf.numel() < count:
            largest = max(c.size_bytes for c in self._cases_of(case.op, case.param("group")))
            capacity = max(count, -(-count * largest // case.size_bytes))
            buf = self._arena[role] = self.torch.empty(capacity, dtype=self.dtype, device=self.device)
        return buf[:count]

    def _cases_of(self, op: str, case_group: str | None) -> list[Case]:
        if self._case_list is None:
            self._case_list = self.cases()
        return [c for c in self._case_list if c.op == op and c.param("group") == case_group]

    def prepare(self, case: Case) -> None:
        count = case.size_bytes // self.elem
        group = self._group(case)
        chunk = count // group.size
        in_place = case.param("placement") == "in"
        name, r = case.op, group.rank
        if name in ("all_reduce", "broadcast"):
            send = recv = fill_pattern(self._buffer(case, "send", count), r)
        elif name == "reduce_scatter":
            send = fill_pattern(self._buffer(case, "send", count), r)
            recv = send[r * chunk:(r + 1) * chunk] if in_place else self._buffer(case, "recv", chunk)
        elif name == "all_gather":
            recv = self._buffer(case, "recv", count).zero_()
            if in_place:
                send = fill_pattern(recv[r * chunk:(r + 1) * chunk], r)
            else:
                send = fill_pattern(self._buffer(case, "send", chunk), r)
        elif name == "all_to_all":
            send = fill_pattern(self._buffer(case, "send", count), r)
            recv = self._buffer(case, "recv", count)
        else:  # guarded in __init__
            raise UsageError(f"unknown op {name!r}")
        self._buffers = {"send": send, "recv": recv}

    def run_once(self, case: Case) -> None:
        send, recv = self._buffers["send"], self._buffers["recv"]
        ops = self._group(case).ops
        if case.op in ("all_reduce", "broadcast"):
            ops[case.op](recv)
        else:
            ops[case.op](recv, send)
        return None

    def sync(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)

    def timed_on(self, case: Case) -> Any:
        # torch's NCCL collectives wait on the current stream and make it wait for them, so an
        # event pair on the current stream brackets the collective.
        return self.device if self.device.type == "cuda" else None

    def check(self, case: Case) -> int:
        # In-place reductions feed each iteration's output into the next, so the buffers are
        # refilled for one checked run; every other op's last timed output is already final.
        if case.op == "all_reduce" or (case.op == "reduce_scatter" and case.param("placement") == "in"):
            self.prepare(case)
            self.run_once(case)
            self.sync()
        group = self._group(case)
        return count_wrong(self._buffers["recv"], expected_segments(case.op, case.size_bytes // self.elem,
                                                                     group.size, group.rank))

    def release(self, case: Case) -> None:
        self._buffers = {}

    # ------------------------------------------------------------------ numbers
    def metrics(self, case: Case, time_s: float) -> dict[str, Any]:
        algbw = case.size_bytes / time_s / 1e9
        busbw = algbw * OPS[case.op].factor(self._group(case).size)
        return {"algbw_gbps": algbw, "busbw_gbps": busbw,
                **_pct("busbw", busbw, self._expected(case.op, case.param("group")))}

    def _expected(self, op: str, group: str | None = "world") -> dict[str, Any] | None:
        # Set by the command (run.py) before the sweep; absent in library use.
        if group in (None, "world"):
            return getattr(self, "expected", {}).get(op)
        return getattr(self, "expected_groups", {}).get(group, {}).get(op)

    def summarize(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        from ...core.fit import fit_latency_bandwidth

        per_group: dict[str, dict[str, Any]] = {}
        for group in self.groups.values():
            out = per_group.setdefault(group.name, {})
            for name in self.config.ops:
                op_rows = [r for r in rows if r["op"] == name and r.get("group", "world") == group.name]
                if op_rows:
                    fit = fit_latency_bandwidth(op_rows)
                    expected = self._expected(name, group.name)
                    if fit.get("points") and fit.get("fitted", True):
                        fit.update(_pct("peak_busbw", fit["peak_busbw_gbps"], expected))
                    elif fit.get("points"):
                        # No model to hold against the hardware: the best measured busbw is.
                        fit.update(_pct("measured_max_busbw", fit["measured_max_busbw_gbps"], expected))
                    out[name] = fit
        # "fits" stays the world's curve, where readers of one-level records look for it.
        summary: dict[str, Any] = {"fits": per_group.get("world", {})}
        if self.topology is not None:
            summary["topology"] = {**self.topology.to_dict(), "hosts": self.hosts}
            summary["groups"] = {g.name: {"ranks": g.size, "groups_at_once": g.concurrent, "fits": per_group[g.name]}
                                 for g in self.groups.values()}
        return summary


def _pct(what: str, value: float, expected: dict[str, Any] | None) -> dict[str, Any]:
    """`<what>_pct_of_expected` for a row or fit, when this hardware's expectation is known."""
    if not expected or not expected.get("gbps"):
        return {}
    return {f"{what}_pct_of_expected": 100.0 * value / expected["gbps"]}


SPEC = ProbeSpec(
    name="nccl", command=("nccl",), order=20,
    help="collective bandwidth (NCCL on GPUs, gloo on CPUs), nccl-tests layout",
    description="Sweep collectives over message sizes; print time, algbw, busbw and #wrong per size in the "
                "nccl-tests layout, fit a latency-bandwidth model per op.",
    metrics=("busbw_gbps", "algbw_gbps"), config=Config, build=lambda config, context: CollectiveProbe(config, context.world, transport=context.transport),
    row_schema=NcclRow, validate=validate, run=run_command, printer=print_outcome,
    # 1 s of timed work per case (>= 3 iterations): the default 1M-256M sweep of three ops then
    # ends in about a minute on two CPU ranks; small sizes still run all --iters.
    sweep=SweepDefaults(warmup=5, iters=20, budget_s=1.0, check=True, check_flag=True),
    needs=Needs(world=True), aliases=("collectives",),
    case_keys=("placement", "dtype", "redop", "root", "algo", "group"), case_defaults=(("group", "world"),), identity_keys=("backend",), feeds=("network",),
    # One warm-up iteration per case, not the command's 5: 30 in all over this sweep, as many as
    # nccl-tests' 5 per op at the smallest and largest size; medians unchanged side by side
    # (0.98-1.00x over 3 rounds, docs/BENCHMARKS.md), 1.3 s of the suite's minute.
    # No --nproc: the default is 2 CPU ranks, or one rank per GPU (a 1-GPU host cannot run 2 GPU ranks).
    suite=(SuiteStep("nccl", ("--sizes", "1M-16M", "--warmup", "1"), aliases=("collectives",)),),
)
