"""Calibration, rank side: the three numbers the composer cannot know from probes alone, each
measured on a configuration of its own (never one the matrix checks).

  overlap             the composer's blend between its pipelined step (overlap 1) and the serial
                      sum of its parts (0) that the calibration model's real fully_shard step
                      shows on this backend and link: (P0 - measured) / (P0 - P1) for each step,
                      P0 and P1 predicted at 0 and 1 from the compute replay, collectives and
                      AdamW sampled right before that step, after the two numbers below are known; the
                      median over the steps, clamped to 0..1, on a GPU. On a CPU it is 0 (FSDP2
                      hides nothing there, below) and the readings stay as a diagnostic. Beside
                      it, as a diagnostic, what the backend itself could hide: an async
                      AllGather of a unit with matmuls meanwhile, (C + M - T) / min(C, M) from
                      the times alone and together. FSDP2 on a CPU
                      issues its collectives synchronously (no streams), so it hides nothing
                      there whatever the backend could; NCCL on a GPU runs beside compute.
  unit_overhead_s     FSDP's own cost per unit per pass (hooks, copy-in/out, DTensor dispatch in
                      the optimizer): the calibration model's units (six of them) at 16 tokens, so
                      compute is negligible and nothing overlaps, timed as a real fully_shard
                      step, minus the same model's plain forward+backward, its collectives alone
                      and the AdamW probe at its shard size (the three sampled right before each
                      step), over 2 x units: each step less its own samples, then the median.
  compute_efficiency  the compute replay's time (the step's matmuls, forward and backward, and
                      attention, at the model's shapes) over the model's real forward+backward
                      (norms, activations, residuals, the embedding, the loss, autograd: work the
                      replay does not do), on the calibration model unsharded, the two
                      alternating: the median of the pairs' ratios. What the overlap's
                      fully_shard steps took beyond their serial prediction is recorded beside
                      it (details.overlap.beyond_serial_s) and not applied: its median over the
                      calibration's steps carries more noise than its own size, and the held-out
                      rows came out no better with it (docs/verify.md has the figures).
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from ...compose.calibration import Calibration
from ...core.stats import percentile
from ...world import collectives
from ...world.dist import World
from .. import model as fm
from . import paired, steps as vf

CAL_SHAPE = fm.PRESETS["calib"]
CAL_TOKENS = 384
# FSDP's per-unit cost at realistic unit sizes (its copies scale with the bytes) but almost no
# compute, so nothing overlaps and what is left after compute, collectives and the optimizer is FSDP's.
UNIT_SHAPE = replace(CAL_SHAPE, name="calib-units", layers=6)
UNIT_TOKENS = 16


def compute_efficiency(world: World, device: Any, precision: fm.Precision, dev: str, reps: int = 9) -> dict[str, Any]:
    """The compute replay's time over the calibration model's real forward+backward (unsharded),
    the two alternating: what share of the model's compute time the
    replay's kernels are. The median of each pair's ratio: a burst of someone else's work on a
    shared box moves both sides of a pair, not their ratio."""
    probe = vf.replay(CAL_SHAPE, CAL_TOKENS, dev, precision.param_dtype)
    replays, real = vf.measure_compute_pairs(world, CAL_SHAPE, CAL_TOKENS, device, precision, probe, reps)
    replay_s, measured = percentile(replays, 50), percentile(real, 50)
    ratios = [a / b for a, b in zip(replays, real, strict=False)]
    return {"compute_efficiency": percentile(ratios, 50), "replay_s": replay_s, "measured_s": measured,
            "replay_samples_s": replays, "measured_samples_s": real, "ratios": ratios}


def fsdp_overlap(world: World, device: Any, precision: fm.Precision, dev: str, backend: str, efficiency: float,
                 unit_overhead_s: float, reps: int = 9, layout: Any = None) -> dict[str, Any]:
    # The compute replay, the collective probe and AdamW right before each step, as verify's rows read them.
    sample = paired.inputs_sampler(world, CAL_SHAPE, CAL_TOKENS, device, dev, backend, precision, layout)
    steps, samples = vf.measure_interleaved(world, CAL_SHAPE, CAL_TOKENS, device, precision, reps, 2, sample, layout)
    del sample
    cal = Calibration(0.0, unit_overhead_s, efficiency, "")

    def bounds(inputs: tuple[dict[str, Any], dict[str, Any], dict[str, Any]]) -> tuple[float, float]:
        """The serial (overlap 0) and pipelined (overlap 1) predictions from (compute, collectives, optimizer)."""
        return tuple(vf.predict(CAL_SHAPE, CAL_TOKENS, world.size, precision, *inputs,
                                replace(cal, overlap=o))["step_s"] for o in (0.0, 1.0))

    # The hideable span (serial - pipelined) is a tenth of a CPU step: one step's noise moves the
    # overlap by more than its whole range. Each step is read against the inputs sampled right
    # before it (the machine's drift is in both), and the median of those readings is kept.
    each = [bounds(s.for_predict(CAL_SHAPE, CAL_TOKENS)) for s in samples]
    raws = [_overlap_of(*b, s) for s, b in zip(steps, each, strict=False)]
    value = percentile(raws, 50)
    serial, pipelined = bounds(paired.median_inputs(CAL_SHAPE, CAL_TOKENS, samples))
    # What each step took beyond its serial prediction: a diagnostic of the compute inside a fully_shard step.
    serial_each = [b[0] for b in each]
    beyond = [s - p for s, p in zip(steps, serial_each, strict=False)]
    return {"overlap": min(1.0, max(0.0, value)), "raw": value, "raw_per_step": raws,
            "beyond_serial_s": percentile(beyond, 50), "predicted_serial_per_step_s": serial_each,
            "raw_iqr": [percentile(raws, 25), percentile(raws, 75)], "measured_s": percentile(steps, 50),
            "steps_s": steps, "predicted_serial_s": serial, "predicted_pipelined_s": pipelined,
            "model": CAL_SHAPE.name, "tokens": CAL_TOKENS}


def _overlap_of(serial: float, pipelined: float, measured: float) -> float:
    """Where a measured step sits between the serial (0) and pipelined (1) predictions."""
    return (serial - measured) / (serial - pipelined) if serial > pipelined else 0.0


def backend_overlap(world: World, device: Any, precision: fm.Precision, reps: int = 5) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    if world.size == 1:
        return {"overlap": 1.0, "why": "one rank: nothing to overlap"}
    n = world.size
    dtype = getattr(torch, precision.param_dtype)
    count = CAL_SHAPE.block_params // n * n
    full = torch.zeros(count, dtype=dtype, device=device)
    shard = torch.ones(count // n, dtype=dtype, device=device)
    gen = torch.Generator().manual_seed(world.rank)
    a = torch.randn(CAL_TOKENS, CAL_SHAPE.hidden, generator=gen).to(device, dtype)
    b = torch.randn(CAL_SHAPE.hidden, 2 * CAL_SHAPE.ffn, generator=gen).to(device, dtype)

    def timed(fn: Any) -> float:
        world.barrier()
        start = time.perf_counter()
        fn()
        vf.sync(device)
        return time.perf_counter() - start

    def matmuls(k: int) -> None:
        for _ in range(k):
            torch.matmul(a, b)

    all_gather = collectives.all_gather(dist)

    def gather() -> None:
        all_gather(full, shard)

    for _ in range(2):
        timed(gather), timed(lambda: matmuls(1))
    one_mm = vf.slowest(world, percentile([timed(lambda: matmuls(1)) for _ in range(3)], 50))
    one_ag = vf.slowest(world, percentile([timed(gather) for _ in range(3)], 50))
    k = max(1, round(one_ag / max(one_mm, 1e-9)))   # as much compute as communication

    def together() -> None:
        work = all_gather(full, shard, async_op=True)
        matmuls(k)
        work.wait()

    c_alone, m_alone, both = [], [], []
    for _ in range(reps):
        c_alone.append(timed(lambda: matmuls(k)))
        m_alone.append(timed(gather))
        both.append(timed(together))
    c, m, t = (vf.slowest(world, percentile(x, 50)) for x in (c_alone, m_alone, both))
    # A world of one gathers nothing: no communication to hide, so nothing to measure.
    value = (c + m - t) / min(c, m) if world.size > 1 and min(c, m) > 0 else 0.0
    return {"overlap": min(1.0, max(0.0, value)), "raw": value, "compute_alone_s": c, "comm_alone_s": m,
            "together_s": t, "matmuls": k, "unit_bytes": count * precision.bytes}


def unit_overhead(world: World, device: Any, precision: fm.Precision, reps: int = 15,
                  layout: Any = None) -> dict[str, Any]:
    shape, tokens = UNIT_SHAPE, UNIT_TOKENS
    # The plain forward+backward, the collectives alone and the AdamW probe at the shard size,
    # right before each fully_shard step, so the difference is not a drift of the machine between them.
    compute, comm = (vf.compute_alone_sampler(world, shape, tokens, device, precision),
                     vf.comm_alone_sampler(world, shape, precision, device, layout))
    optimizer, _ = vf.optimizer_sampler(world, shape, device, layout)
    fsdp, parts = vf.measure_interleaved(world, shape, tokens, device, precision, reps, 2,
                                         lambda: (compute(), comm(), optimizer()), layout)
    units = shape.layers + 1
    # Each step less the samples taken right before it, then the median: a difference of
    # medians carries every part's noise, and an optimizer probe timed once, apart from the
    # steps, moved the per-unit cost between runs with the machine's drift (docs/verify.md).
    left_s = percentile([f - c - m - o for f, (c, m, o) in zip(fsdp, parts, strict=False)], 50)
    per_unit = max(0.0, left_s / (2 * units))
    return {"unit_overhead_s": per_unit, "left_s": left_s, "fsdp_step_s": percentile(fsdp, 50),
            "compute_alone_s": percentile([c for c, _, _ in parts], 50),
            "comm_alone_s": percentile([m for _, m, _ in parts], 50),
            "optimizer_s": percentile([o for _, _, o in parts], 50), "units": units, "model": shape.name,
            "tokens": tokens, "fsdp_steps_s": fsdp, "samples_s": parts}


def calibrate(world: World, device: Any, precision: fm.Precision, dev: str, backend: str,
              layout: Any = None, reps: int | None = None) -> dict[str, Any]:
    """Every rank runs this; the result (same on every rank) is summary.calibration's form. With
    a hybrid layout, its overlap and unit cost are HSDP's (calibrated on its own configuration).
    reps (--cal-reps): timed steps or pairs for each of the three numbers instead of their defaults."""
    n = {} if reps is None else {"reps": reps}
    eff = compute_efficiency(world, device, precision, dev, **n)
    uo = unit_overhead(world, device, precision, layout=layout, **n)
    ov = fsdp_overlap(world, device, precision, dev, backend, eff["compute_efficiency"], uo["unit_overhead_s"],
                      layout=layout, **n)
    # FSDP2 overlaps its collectives with compute only on a GPU (its own streams); on a CPU it
    # issues them synchronously, so a step there hides nothing, and an overlap read from its
    # steps would only carry their noise into every prediction.
    overlaps = dev != "cpu"
    could = backend_overlap(world, device, precision)
    return {"overlap": ov["overlap"] if overlaps else 0.0, "unit_overhead_s": uo["unit_overhead_s"],
            "compute_efficiency": eff["compute_efficiency"], "backend": backend, "device": dev,
            "ranks": world.size, "param_dtype": precision.param_dtype,
            "sharding": layout.sharding if layout is not None else "full",
            "model": {"family": fm.FAMILY, "name": CAL_SHAPE.name, "tokens": CAL_TOKENS},
            "details": {"overlap": ov, "backend_overlap": could, "unit_overhead": uo, "compute_efficiency": eff}}


def as_calibration(cal: dict[str, Any], source: str) -> Calibration:
    """summary.calibration as verify's predictions take it: no efficiency recorded counts as 1."""
    return Calibration(
        float(cal["overlap"]),
        float(cal["unit_overhead_s"]),
        float(cal.get("compute_efficiency") or 1.0),
        source,
        cal.get("backend"),
        cal.get("device"),
    )
