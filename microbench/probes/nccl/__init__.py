"""Collective bandwidth over torch.distributed (NCCL on GPUs, gloo on CPUs).

Each collective is one `CollOp` entry (ops.py), with its buffers, call, expected values and bus
factor as nccl-tests' `struct testColl` has them. Sizes, bus bandwidth and in-place semantics
follow nccl-tests exactly, so numbers compare one to one:

  algbw = S / t.  busbw = algbw * factor(n), nccl-tests' factors (units.bus_factor, shared with
  the composer): AllReduce 2(n-1)/n; ReduceScatter, AllGather, AllToAll (n-1)/n; Broadcast 1.
  S is the largest buffer of the op: the full gathered buffer for AllGather, the full input for
  ReduceScatter, the per-rank buffer for AllReduce, AllToAll and Broadcast.

Correctness: every rank sends a known pattern and every element received is compared with what
the op must deliver (pattern.py); #wrong counts the mismatches.
"""

from __future__ import annotations

from typing import Any, Callable

from ...core.errors import UsageError
from ...core.probe import Case, Probe, RankGroup
from ...core.registry import Needs, ProbeSpec, SuiteStep, SweepDefaults
from ...core.units import DTYPES, bus_factor, element_size  # noqa: F401  (DTYPES: one table, read through here too)
from ...results.schema import ProbeRow
from .config import Config, validate
from .ops import (  # noqa: F401
    ALGOS,
    DEFAULT_OPS,
    OPS,
    PROCESS_BYTES,
    RING_OPS,
    STAGING,
    CollOp,
    Segment,
    check_algo,
    effective_size,
    op_named,
)
from .pattern import count_wrong, fill_pattern, pattern, segments_tensor  # noqa: F401
from .plan import MemoryPlan, bytes_needed_per_rank, op_bytes_per_rank, plan_memory, role_bytes  # noqa: F401
from .run import print_outcome, run as run_command


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




def expected_segments(op: str, count: int, n: int, rank: int) -> list[Segment]:
    """What rank `rank`'s output buffer must hold after `op` over n ranks on the patterns, as
    (start, length, tile) segments: element start+k must equal tile[k mod 3]. count is the op's
    element count (its size S over the element size)."""
    return op_named(op).expected(count, n, rank)


def expected_result(op: str, count: int, n: int, rank: int, *, dtype: Any = None, device: Any = "cpu") -> Any:
    """The expected output as a tensor (for tests and small checks)."""
    return segments_tensor(expected_segments(op, count, n, rank), dtype=dtype, device=device)


def cpu_threads_per_rank(torch: Any) -> int:
    """Give each rank of a CPU world its share of the cores and set it. torch's default, every
    core per rank, oversubscribes them: gloo's reduce_scatter clones and copies S and its
    all_gather copies out S with torch's threads, so 2 ranks x 2 threads on 2 cores fought over
    them and the probe read below a bare loop with one thread per rank
    (benchmarks/nccl_overhead.py; figures in docs/BENCHMARKS.md)."""
    import os

    from ...world.topology import machine_ranks

    local = machine_ranks()
    threads = max(1, (os.cpu_count() or 1) // max(local, 1))
    torch.set_num_threads(threads)
    return threads


class CollectiveProbe(Probe):
    name = "nccl"

    def __init__(self, config: Config, world: RankGroup, transport: Callable[[], dict[str, Any]] | None = None):
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
        assert config.dtype is not None   # resolved by validate
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
        for group in self.groups.values():
            ring = None
            if config.algo == "ring":
                from .ring import Ring

                ring = Ring(dist, group.rank, group.size, peers=group.members)
            for name in config.ops:
                op = OPS[name]
                root = group.members[op.root] if op.root >= 0 else -1
                group.ops[name] = (op.ring_call(ring) if ring is not None and op.ring_call is not None
                                   else op.torch_call(dist, group.pg, root))

    def implementation(self) -> dict[str, Any]:
        engine = (f"microbench ring over torch.distributed send/recv ({self.config.backend})"
                  if self.config.algo == "ring" else f"torch.distributed/{self.config.backend}")
        return {"engine": engine, "algo": self.config.algo, "backend": self.config.backend,
                "device": self.config.device,
                **({"cpu_threads_per_rank": self.cpu_threads} if self.cpu_threads else {}),
                **(self._transport() if self._transport else {})}

    def cases(self) -> list[Case]:
        """Every op, group, size and placement of the sweep, but those the memory plan skips
        (run.py sets `memory_plan` from the ranks' free memory before the sweep)."""
        plan = getattr(self, "memory_plan", None)
        out = []
        for name in self.config.ops:
            op = OPS[name]
            for group in self.groups.values():
                seen = set()
                for requested in self.config.sizes:
                    size = effective_size(op, requested, group.size, self.elem,
                                          chunked=op.chunked or self.config.algo == "ring")
                    if size in seen:
                        continue
                    seen.add(size)
                    for placement in op.placements:
                        if plan is None or not plan.skips(name, requested, placement):
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
    def _buffer(self, case: Case, role: str, count: int) -> Any:
        """A `count`-element view of this op's `role` arena, sized for the largest case of the op
        that uses the role (plan.role_bytes): an in-place 4G case that runs where the out-of-place
        one was skipped must not get the 2 GiB output chunk only out of place needs."""
        if self._arena_op != case.op:
            self._arena, self._arena_op = {}, case.op  # free the previous op's buffers first
        buf = self._arena.get(role)
        if buf is None or buf.numel() < count:
            group = self._group(case)
            capacity = max([count] + [role_bytes(c.op, c.size_bytes, group.size, c.param("placement")).get(role, 0)
                                      // self.elem for c in self._cases_of(case.op, case.param("group"))])
            buf = self._arena[role] = self.torch.empty(capacity, dtype=self.dtype, device=self.device)
        return buf[:count]

    def _cases_of(self, op: str, case_group: str | None) -> list[Case]:
        if self._case_list is None:
            self._case_list = self.cases()
        return [c for c in self._case_list if c.op == op and c.param("group") == case_group]

    def prepare(self, case: Case) -> None:
        group = self._group(case)
        send, recv = OPS[case.op].buffers(lambda role, count: self._buffer(case, role, count),
                                          case.size_bytes // self.elem, group.size, group.rank,
                                          case.param("placement") or "out")
        self._buffers = {"send": send, "recv": recv}

    def run_once(self, case: Case) -> None:
        self._group(case).ops[case.op](self._buffers["send"], self._buffers["recv"])
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
        if case.param("placement") in OPS[case.op].feeds_back:
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
        plan = getattr(self, "memory_plan", None)
        if plan is not None and plan.skipped:
            # Not rows: every reader of rows (fits, compose, compare, plots) reads a measured time.
            summary["skipped"] = {"reason": f"does not fit in memory: {plan.why()}",
                                  "cases": [one.to_dict() for one in plan.skipped]}
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
    name="nccl",
    command=("nccl",),
    order=20,
    help="collective bandwidth (NCCL on GPUs, gloo on CPUs), nccl-tests layout",
    description="Sweep collectives over message sizes; print time, algbw, busbw and #wrong per size in the "
    "nccl-tests layout, fit a latency-bandwidth model per op.",
    metrics=("busbw_gbps", "algbw_gbps"),
    config=Config,
    build=lambda config, context: CollectiveProbe(config, context.world, transport=context.transport),
    row_schema=NcclRow,
    validate=validate,
    run=run_command,
    printer=print_outcome,
    # 1 s of timed work per case (>= 3 iterations): the default 1M-256M sweep of three ops then
    # ends in about a minute on two CPU ranks; small sizes still run all --iters.
    sweep=SweepDefaults(warmup=5, iters=20, budget_s=1.0, check=True, check_flag=True),
    needs=Needs(world=True),
    aliases=("collectives",),
    case_keys=("placement", "dtype", "redop", "root", "algo", "group"),
    case_defaults=(("group", "world"),),
    identity_keys=("backend",),
    feeds=("network",),
    # One warm-up iteration per case, not the command's 5: 30 in all over this sweep, as many as
    # nccl-tests' 5 per op at the smallest and largest size; medians unchanged side by side
    # (docs/BENCHMARKS.md), and seconds off the suite's minute.
    # No --nproc: the default is 2 CPU ranks, or one rank per GPU (a 1-GPU host cannot run 2 GPU ranks).
    suite=(SuiteStep("nccl", ("--sizes", "1M-16M", "--warmup", "1"), aliases=("collectives",)),),
)
