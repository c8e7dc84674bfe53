"""`hunt --bisect`: all_reduce over halves of the hosts, going into the slow half.

The all_reduce is the collectives probe's own (buffers, pattern check, busbw), run by
runner.measure_case over a sub-world: the hosts of one half, in a gloo group of their own,
so that both halves run at once. Every rank takes every step: torch needs all ranks to create
each group, and every rank reaches the same decision from the same gathered numbers.
"""

from __future__ import annotations

import datetime
import time
from typing import Any

from ..core.errors import RunError
from ..probes.nccl import CollectiveProbe, Config
from ..run.runner import SweepSettings, measure_case
from ..world.dist import World
from . import hunt
from .hunt import HuntOptions


class SubWorld:
    """The part of World that measure_case and CollectiveProbe use, over a group of ranks."""

    def __init__(self, dist: Any, group: Any, ranks: list[int], rank: int):
        self._dist, self.group, self.ranks = dist, group, ranks
        self.rank, self.size = ranks.index(rank), len(ranks)

    def all_gather_object(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self.size
        self._dist.all_gather_object(out, obj, group=self.group)
        return out

    def broadcast_object(self, obj: Any) -> Any:
        box = [obj]
        self._dist.broadcast_object_list(box, src=self.ranks[0], group=self.group)  # src: a global rank
        return box[0]

    def barrier(self) -> None:
        self._dist.barrier(group=self.group)


def _groups(halves: tuple[list[int], list[int]], participants: list[int], opts: HuntOptions) -> list[Any]:
    import torch.distributed as dist

    # Every rank creates both groups (new_group waits for all of them), so the halves then run at once.
    timeout = datetime.timedelta(seconds=opts.timeout_s)
    return [dist.new_group(ranks=[participants[i] for i in half], backend="gloo", timeout=timeout) for half in halves]


def _all_reduce_row(world: World, groups: list[Any], halves: tuple[list[int], list[int]], participants: list[int],
                    me: int | None, opts: HuntOptions) -> dict[str, Any] | None:
    """This rank's row of the all_reduce over its half, None when it is in neither."""
    import torch.distributed as dist

    half = next((k for k in (0, 1) if me in halves[k]), None)
    if half is None:
        return None
    sub = SubWorld(dist, groups[half], [participants[i] for i in halves[half]], world.rank)
    # The probe's collectives run on the sub-world's own group (SubWorld.group).
    probe = CollectiveProbe(Config(sizes=[opts.size_bytes], ops=["all_reduce"], dtype="float32"), sub)
    settings = SweepSettings(warmup=opts.warmup, iters=opts.iters, budget_s_per_case=None, progress=False)
    return measure_case(probe, probe.cases()[0], settings, sub)


def bisect(world: World, participants: list[int], names: list[str], me: int | None, opts: HuntOptions,
           emit: Any) -> tuple[list[int], list[int], list[dict[str, Any]]]:
    """Halve until the suspects are fewer than 4 or halving cannot tell; returns (suspects,
    cleared, steps). suspects is every host when the first halving was already inconclusive."""
    suspects: list[int] = list(range(len(names)))
    cleared: list[int] = []
    steps: list[dict[str, Any]] = []
    while len(suspects) >= hunt.BISECT_MIN_HOSTS:
        a, b = hunt.halves(suspects)
        groups = _groups((a, b), participants, opts)
        world.barrier()
        start = time.monotonic()
        gathered = world.all_gather_object(_all_reduce_row(world, groups, (a, b), participants, me, opts))
        seconds = time.monotonic() - start
        busbw = [gathered[participants[half[0]]]["busbw_gbps"] for half in (a, b)]
        wrong = sum(gathered[participants[half[0]]]["nwrong"] or 0 for half in (a, b))
        if wrong:
            raise RunError(f"hunt --bisect: the all_reduce over halves returned {wrong} wrong element(s); "
                           f"the hosts corrupt data, which is worse than slow: run `microbench verify`")
        slow = hunt.slower_half(busbw[0], busbw[1], opts.slow_ratio, opts.floor_gbps)
        step = {"step": len(steps) + 1, "halves": [[names[h] for h in a], [names[h] for h in b]],
                "busbw_gbps": busbw, "slow_half": slow, "seconds": seconds}
        steps.append(step)
        emit(step)
        if slow is None:
            break
        suspects, cleared = (a, cleared + b) if slow == 0 else (b, cleared + a)
    return suspects, cleared, steps
