"""Verification, rank side: what is measured against the prediction, every rank starting together and
the slowest rank's time kept: real FSDP2 steps of the fully_shard model, and beside them, per part,
the unsharded model's forward+backward alone and the step's collectives alone (steps.py has the
inputs, the prediction and how the two are compared)."""

from __future__ import annotations

import time
from typing import Any, Callable

from ...compose.fsdp import schedule
from ...compose.model import ModelShape
from ...core.stats import percentile
from ...core.units import element_size
from ...probes.compute.replay import StepReplay
from ...world import collectives
from ...world.dist import World
from .. import model as fm
from . import hybrid
from .steps import slowest, sync, unit_sizes


def measure_steps(
    world: World,
    shape: ModelShape,
    tokens: int,
    device: Any,
    precision: fm.Precision,
    steps: int,
    warmup: int,
    layout: Any = None,
) -> list[float]:
    """The slowest rank's time for each timed step of the fully_shard model."""
    return measure_interleaved(world, shape, tokens, device, precision, steps, warmup, None, layout)[0]


def measure_interleaved(
    world: World,
    shape: ModelShape,
    tokens: int,
    device: Any,
    precision: fm.Precision,
    steps: int,
    warmup: int,
    before_each: Callable[[], Any] | None,
    layout: Any = None,
) -> tuple[list[float], list[Any]]:
    """Timed steps of the fully_shard model (the slowest rank's time each), with `before_each`
    (a probe sample) run right before each one: on a shared machine its speed drifts by tens of
    percent within a minute, and alternating puts the same drift into the prediction's input
    and into the steps it predicts. Returns (step times, the samples of the timed steps)."""
    import torch

    torch.manual_seed(0)
    model = fm.shard(
        fm.build(shape, device),
        precision,
        mesh=hybrid.mesh(layout, device) if layout is not None and layout.hybrid else None,
    )
    optim = fm.optimizer(model)
    ids, targets = fm.batch(shape, tokens, device, seed=world.rank)
    times, samples = [], []
    for i in range(warmup + steps):
        sample = before_each() if before_each is not None else None
        world.barrier()
        start = time.perf_counter()
        fm.step(model, optim, ids, targets)
        sync(device)
        if i >= warmup:
            times.append(time.perf_counter() - start)
            samples.append(sample)
    per_rank = world.all_gather_object(times)
    del model, optim
    return [max(step) for step in zip(*per_rank, strict=False)], samples


def compute_alone_sampler(
    world: World, shape: ModelShape, tokens: int, device: Any, precision: fm.Precision
) -> Callable[[], float]:
    """One forward+backward of the unsharded model per call, every rank at once, no
    communication: the slowest rank's seconds."""
    import torch

    torch.manual_seed(0)
    model = fm.build(shape, device)
    if precision.param_dtype != "float32":
        model = model.to(getattr(torch, precision.param_dtype))
    ids, targets = fm.batch(shape, tokens, device, seed=world.rank)

    def once() -> float:
        world.barrier()
        start = time.perf_counter()
        model(ids, targets).backward()
        sync(device)
        elapsed = time.perf_counter() - start
        model.zero_grad(set_to_none=True)
        return slowest(world, elapsed)

    return once


def measure_compute_alone(
    world: World, shape: ModelShape, tokens: int, device: Any, precision: fm.Precision, reps: int = 5
) -> float:
    once = compute_alone_sampler(world, shape, tokens, device, precision)
    once()
    return percentile([once() for _ in range(reps)], 50)


def measure_compute_pairs(
    world: World, shape: ModelShape, tokens: int, device: Any, precision: fm.Precision, probe: StepReplay, reps: int
) -> tuple[list[float], list[float]]:
    """(replay times, the unsharded model's forward+backward times), alternating, every rank at once."""
    model = compute_alone_sampler(world, shape, tokens, device, precision)
    replays, real = [], []
    for i in range(1 + reps):
        replay_s, model_s = probe.time_once(world), model()
        if i >= 1:
            replays.append(replay_s)
            real.append(model_s)
    return replays, real


def comm_alone_sampler(
    world: World, shape: ModelShape, precision: fm.Precision, device: Any, layout: Any = None
) -> Callable[[], float]:
    """The step's collectives back to back per call, nothing else: root and every block gathered
    for forward, blocks gathered again for backward, every unit's gradients reduce-scattered
    (hybrid: in the node, then all-reduced across nodes)."""
    import torch
    import torch.distributed as dist

    if layout is not None and layout.hybrid:
        run = hybrid.comm_plan(world, shape, precision, device, unit_sizes(shape, precision), layout.topo)
        return hybrid.timed_sampler(world, device, run, sync, slowest)
    n = world.size
    if n == 1:
        return lambda: 0.0
    sizes = unit_sizes(shape, precision)
    pd, rd = getattr(torch, precision.param_dtype), getattr(torch, precision.reduce_dtype)

    def bufs(nbytes: int, dtype: Any, elem: int) -> tuple[Any, Any]:
        count = max(n, nbytes // elem // n * n)
        return torch.zeros(count, dtype=dtype, device=device), torch.zeros(count // n, dtype=dtype, device=device)

    rbytes = element_size(precision.reduce_dtype)
    buffers = {(unit, "all_gather"): bufs(sizes[f"{unit}_ag"], pd, precision.bytes) for unit in ("block", "root")}
    buffers.update({(unit, "reduce_scatter"): bufs(sizes[f"{unit}_rs"], rd, rbytes) for unit in ("block", "root")})
    plan = [(c.op, buffers[(c.unit, c.op)]) for c in schedule(shape.layers)]
    all_gather, reduce_scatter = collectives.all_gather(dist), collectives.reduce_scatter(dist)

    def once() -> float:
        world.barrier()
        start = time.perf_counter()
        for what, (full, shard) in plan:
            if what == "all_gather":
                all_gather(full, shard)
            else:
                reduce_scatter(shard, full)
        sync(device)
        return slowest(world, time.perf_counter() - start)

    return once


def measure_comm_alone(
    world: World, shape: ModelShape, precision: fm.Precision, device: Any, reps: int = 2, layout: Any = None
) -> float:
    once = comm_alone_sampler(world, shape, precision, device, layout)
    once()
    return percentile([once() for _ in range(reps)], 50)
