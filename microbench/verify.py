"""Verification: real FSDP2 steps, predicted vs measured, with the error.

On every rank of a world: (1) calibrate the compute rate by running the unsharded model's
forward and backward on all ranks at once (so ranks contend for cores/GPUs as in training),
(2) measure AllGather and ReduceScatter at the model's unit sizes with the collective probe
(or read a saved `microbench nccl` record), (3) run real `fully_shard` steps. Rank 0 feeds
(1) and (2) to the composer and reports its prediction beside (3).

The model is a stack of MLP blocks (Linear h->4h, GELU, Linear 4h->h), one FSDP unit each:
8h^2 + 5h parameters per unit and 2 x params x tokens forward FLOPs, the composer's assumptions.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from .compose import Curve, ModelSpec, TrainSpec, predict_step
from .probes import collectives as coll
from .runner import SweepSettings, measure_case
from .stats import percentile


@dataclass
class FsdpVerifyConfig:
    hidden: int = 256
    layers: int = 4
    tokens: int = 512
    steps: int = 6
    warmup: int = 2
    dtype: str = "float32"
    nccl_record: str | None = None


def unit_params(hidden: int) -> int:
    return 8 * hidden * hidden + 5 * hidden


def build_model(cfg: FsdpVerifyConfig, device: Any) -> Any:
    import torch

    h = cfg.hidden
    blocks = [torch.nn.Sequential(torch.nn.Linear(h, 4 * h), torch.nn.GELU(), torch.nn.Linear(4 * h, h))
              for _ in range(cfg.layers)]
    return torch.nn.Sequential(*blocks).to(device=device, dtype=getattr(torch, cfg.dtype))


def _fwd_bwd(model: Any, batch: Any) -> None:
    model(batch).float().pow(2).mean().backward()


def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed_steps(world: Any, cfg: FsdpVerifyConfig, model: Any, batch: Any, device: Any,
                 after: Any) -> list[float]:
    """Forward+backward times after cfg.warmup untimed steps, every rank starting together;
    `after` runs untimed between steps."""
    times = []
    for i in range(cfg.warmup + cfg.steps):
        world.barrier()
        start = time.perf_counter()
        _fwd_bwd(model, batch)
        _sync(device)
        elapsed = time.perf_counter() - start
        after()
        if i >= cfg.warmup:
            times.append(elapsed)
    return times


def calibrate_flops(world: Any, cfg: FsdpVerifyConfig, device: Any) -> float:
    """Achieved FLOP/s per rank for this model's forward+backward, all ranks busy at once."""
    import torch

    torch.manual_seed(world.rank)
    model = build_model(cfg, device)
    batch = torch.randn(cfg.tokens, cfg.hidden, device=device, dtype=model[0][0].weight.dtype)
    times = _timed_steps(world, cfg, model, batch, device, lambda: model.zero_grad(set_to_none=True))
    slowest = max(world.all_gather_object(percentile(times, 50)))
    flops = 6 * unit_params(cfg.hidden) * cfg.layers * cfg.tokens
    return flops / slowest


def measure_curves(world: Any, cfg: FsdpVerifyConfig, device: str, backend: str) -> dict[str, Any]:
    """AllGather and ReduceScatter rows around the unit size, as a record-like dict."""
    unit_bytes = unit_params(cfg.hidden) * coll.element_size(cfg.dtype)
    sizes = sorted({max(1 << 12, unit_bytes // 4), unit_bytes, unit_bytes * 4})
    config = coll.Config(sizes=sizes, ops=["all_gather", "reduce_scatter"], dtype=cfg.dtype, backend=backend, device=device)
    probe = coll.CollectiveProbe(config, world)
    settings = SweepSettings(warmup=3, iters=10, budget_s_per_case=1.0, check=False, progress=False)
    rows = [measure_case(probe, case, settings, world) for case in probe.cases() if case.param("placement") == "out"]
    return {"rows": rows, "config": {"world": {"size": world.size}}}


def measure_fsdp(world: Any, cfg: FsdpVerifyConfig, device: Any) -> list[float]:
    """Per-step forward+backward time of a fully_shard model, the slowest rank's per step."""
    import torch
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = build_model(cfg, device)
    for block in model:
        fully_shard(block)
    fully_shard(model)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch = torch.randn(cfg.tokens, cfg.hidden, device=device, dtype=getattr(torch, cfg.dtype))

    def optimizer_step() -> None:  # outside the timed region: the composer models forward+backward only
        optim.step()
        optim.zero_grad(set_to_none=True)

    times = _timed_steps(world, cfg, model, batch, device, optimizer_step)
    per_rank = world.all_gather_object(times)
    return [max(step) for step in zip(*per_rank)]


def predict(cfg: FsdpVerifyConfig, ranks: int, flops_per_rank: float, curves: dict[str, Any]) -> dict[str, Any]:
    ag = Curve.from_record(curves, "all_gather")
    rs = Curve.from_record(curves, "reduce_scatter")
    model = ModelSpec("verify-mlp", unit_params(cfg.hidden) * cfg.layers, cfg.layers)
    train = TrainSpec(ranks=ranks, micro_batch=1, seq_len=cfg.tokens, flops_per_rank=flops_per_rank,
                      param_dtype=cfg.dtype, reduce_dtype=cfg.dtype)
    return predict_step(model, train, ag, rs).as_dict()


def error_pct(predicted: float, measured: float) -> float:
    return 100.0 * (predicted - measured) / measured
