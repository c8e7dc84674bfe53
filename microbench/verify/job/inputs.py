"""verify job, rank side: the prediction's inputs, every one a probe run in this invocation on the
configuration's own tiers before the job starts (no number is taken from the job it predicts).

  model load   the modelload probe (every-rank: every rank loads every shard with safetensors
               into preallocated tensors, cold cache) on the model's tier, for a model directory
               in this model's layout (the same tensors in the same shards, each rounded up to
               whole 1024-element rows); from S3 each shard fetched whole with ranged GETs and
               parsed, as the job fetches it;
  data stall   the dataload probe on the data tier over the job's own dataset (WebDataset shards,
               the job's workers and batch size): samples/s and the wait for the first batch;
               the composer's data_stall turns them into a stall per step;
  checkpoint   the checkpoint probe on the checkpoint tier with a state dict in the real
               training state's layout (model + AdamW), saved as the job saves: the time the loop
               is blocked, and on a cached mount (or an async save) the time until durable;
  step         verify fsdp's step prediction: the compute probe's kernels at the step's shapes,
               the collectives at the unit sizes, AdamW at the shard size, with the calibration.
"""

from __future__ import annotations

import json
import math
import time
from typing import Any

from ...core.stats import percentile
from ...probes.modelload import model_dir as md
from ...run.runner import SweepSettings, measure_case
from ...world.dist import World
from .. import model as fm
from ..fsdp import steps as vf
from ..fsdp.steps import sync


def settings(iters: int = 3, warmup: int = 1) -> SweepSettings:
    return SweepSettings(warmup=warmup, iters=iters, budget_s_per_case=None, min_iters=iters, check=True,
                         progress=False)


# --------------------------------------------------------------------------- the model's files

def model_state(shape: Any, seed: int = 0) -> dict[str, Any]:
    """The unsharded model's parameters (tied weights once), as the job writes and loads them."""
    import torch

    torch.manual_seed(seed)
    model = fm.build(shape, "cpu")
    return {name: p.detach().clone().contiguous() for name, p in model.named_parameters()}


def shard_plan(names: list[str]) -> tuple[int, int]:
    """(tensors per shard, shards): as modelload deals tensors, at most MIN_SHARDS shards for a
    model far below 5 GB."""
    shards = min(len(names), md.MIN_SHARDS)
    per = math.ceil(len(names) / shards)
    return per, math.ceil(len(names) / per)


def shard_key(k: int, shards: int) -> str:
    return f"model-{k + 1:05d}-of-{shards:05d}.safetensors"


def write_model(place: Any, state: dict[str, Any]) -> list[str]:
    """Rank 0: the HF-style directory (shards + index) on the place; the shard keys."""
    from safetensors.torch import save

    names = list(state)
    per, shards = shard_plan(names)
    keys, weight_map = [], {}
    for k in range(shards):
        part = {n: state[n] for n in names[k * per:(k + 1) * per]}
        key = shard_key(k, shards)
        place.put(key, save(part, metadata={"format": "pt"}))
        weight_map.update({n: key for n in part})
        keys.append(key)
    total = sum(t.numel() * t.element_size() for t in state.values())
    place.put(md.INDEX, json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}).encode())
    return keys


def mirrored_layout(state: dict[str, Any]) -> md.Layout:
    names = list(state)
    per, shards = shard_plan(names)
    tensors = tuple(md.Tensor(f"model.layers.{i}.weight", max(1, math.ceil(state[n].numel() / md.COLUMNS)), i // per)
                    for i, n in enumerate(names))
    return md.Layout("float32", 4, tensors, shards)


# --------------------------------------------------------------------------- probes

def probe_model_load(world: World, place: Any, state: dict[str, Any], dev: str, backend: str) -> dict[str, Any]:
    import torch

    from ...probes import modelload as ml
    from ...probes.modelload.store import LocalModel, S3Model

    lay = mirrored_layout(state)
    facts = {"target_kind": "local" if place.local else "s3", "model_dir": place.display, "tier": place.tier}
    model = (LocalModel(lay, place.root, facts) if place.local else
             S3Model(lay, place.s3, place.bucket, place.prefix, place.server_root, facts))
    if world.rank == 0:
        model.write(torch)
        place.settle(120)
    world.barrier()
    config = ml.Config(target=place.display, size_bytes=lay.total_bytes, dtype="float32", mode=["every-rank"],
                       device=dev, backend=backend)
    probe = ml.ModelloadProbe(config, world, model)
    case = next(c for c in probe.cases() if c.op == "every-rank")
    row = measure_case(probe, case, settings(), world)
    how = "files through safetensors.load_file" if place.local else "each shard fetched whole with ranged GETs, parsed"
    return {"load_s": row["time_us"]["p50"] / 1e6, "load_gbps": row["load_gbps"], "bytes": lay.total_bytes,
            "nwrong": row["nwrong"], "iters": row["iters"],
            "source": f"modelload probe (every-rank) on {place.tier} in this run: {lay.total_bytes:,} bytes in "
                      f"{len(lay.tensors)} tensors and {lay.shards} safetensors shards (this model's layout), {how}, "
                      f"cold cache, median of {row['iters']}"}


def probe_data(world: World, place: Any, plan: Any, workers: int, batch_size: int, dev: str) -> dict[str, Any]:
    from ...probes import dataload as dl
    from ...probes.dataload.run import Dataset

    config = dl.Config(layout="shards", samples=plan.samples, sample_size=[plan.low, plan.high], workers=[workers],
                       batch_size=batch_size, ranks=world.size, device=dev)
    data = Dataset(plan, place.data_source(), place.cache_files(plan.keys()), False,
                   {"dataset": place.display, "tier": place.tier})
    probe = dl.DataloadProbe(config, world, data)
    (case,) = probe.cases()
    row = measure_case(probe, case, settings(), world)
    return {"samples_per_s": row["samples_per_s"], "first_batch_s": row["first_batch_s"],
            "read_gbps": row["read_gbps"], "nwrong": row["nwrong"], "ranks": world.size, "workers": workers,
            "source": f"dataload probe on {place.tier} in this run: the job's dataset ({plan.samples} samples of "
                      f"{plan.low} bytes in {len(plan.shards)} shards), workers={workers}, batch {batch_size}, "
                      f"cold cache, median of {row['iters']}"}


def probe_checkpoint(world: World, run_dir: Any, layout: list[Any], async_ckpt: bool, dev: str,
                     backend: str) -> dict[str, Any]:
    from ...probes import checkpoint as ck
    from ...probes.checkpoint import state_layout as ckl

    nbytes = ckl.layout_bytes(layout, world.size)
    probe = ck.CheckpointProbe(ck.Config(size_bytes=nbytes, target=run_dir.display, dtype="float32", device=dev,
                                         backend=backend, items=tuple(layout), async_save=async_ckpt),
                               world, run_dir)
    case = next(c for c in probe.cases() if c.op == ("async_save" if async_ckpt else "save"))
    # Unchecked: the job's own saves are the ones a restart loads; the probe's check would load
    # every save back, time the tier does not spend in the job.
    row = measure_case(probe, case, SweepSettings(warmup=1, iters=3, budget_s_per_case=None, min_iters=3,
                                                  check=False, progress=False), world)
    time_s = row["time_us"]["p50"] / 1e6
    mount = bool(probe.mount and probe.mount.get("mount_name"))
    if async_ckpt:
        blocking, durable = row["blocked_time_us"] / 1e6, time_s
    elif mount:
        blocking, durable = time_s, row["durable_time_us"] / 1e6
    else:
        blocking, durable = time_s, time_s
    how = ("dcp.async_save: blocked until it returns, durable when its future is done" if async_ckpt else
           "dcp.save through a cached mount: blocked until it returns, durable when the store holds every byte "
           "(polled over the S3 API)" if mount else "dcp.save: durable when it returns")
    # A cached mount's write-back delay (as `mount up` set it) runs beside earlier uploads.
    delay = float((probe.mount or {}).get("write_back_s") or 0.0) if mount and not async_ckpt else 0.0
    return {
        "blocking_s": blocking,
        "durable_s": max(durable, blocking),
        "bytes": nbytes,
        "mount": mount,
        "drain_delay_s": delay,
        "drain_blocks_next": async_ckpt,
        "iters": row["iters"],
        "source": "checkpoint probe on "
        f"{run_dir.display.split('://')[0] if '://' in run_dir.display else 'a directory'}"
        f" in this run: {nbytes:,} bytes in this training state's layout (model + AdamW), {how}, "
        f"median of {row['iters']}",
    }


def fresh_model_probe(
    shape: Any, device: Any, precision: Any, tokens: int, world: World
) -> tuple[list[Any], dict[str, Any]]:
    """A throwaway copy of the sharded model, fresh as the job's is after its load: its first
    steps timed (a fresh FSDP2 model's first step also initializes FSDP's buffers and AdamW's
    state: the extra over the next steps is an input of the prediction), then the layout of its
    training state (AdamW's state exists only after a step), which the checkpoint probe mirrors."""
    import torch
    from torch.distributed.checkpoint.state_dict import get_state_dict

    from ...probes.checkpoint import state_layout as ckl

    torch.manual_seed(0)
    model = fm.shard(fm.build(shape, device), precision)
    optim = fm.optimizer(model)
    ids, targets = fm.batch(shape, tokens, device, seed=world.rank)
    times = []
    for _ in range(4):
        world.barrier()
        start = time.perf_counter()
        fm.step(model, optim, ids, targets)
        sync(device)
        times.append(time.perf_counter() - start)
    times = [max(t) for t in zip(*world.all_gather_object(times), strict=False)]
    msd, osd = get_state_dict(model, optim)
    layout = ckl.state_layout({"model": msd, "optim": osd})
    del model, optim, msd, osd
    extra = max(0.0, times[0] - percentile(times[1:], 50))
    return layout, {"first_step_extra_s": extra, "steps_s": times,
                    "source": "a throwaway copy of the fully_shard model, fresh: its first step minus the median of "
                              "the next three, slowest rank, in this run"}


def step_probes(world: World, shape: Any, device: Any, dev: str, backend: str, precision: Any) -> dict[str, Any]:
    """The collectives at the unit sizes and AdamW at the shard size (before the job)."""
    return {"collectives": vf.probe_collectives(world, shape, precision, dev, backend),
            "optimizer": vf.probe_optimizer(world, shape, device)}


def replay_samples(world: World, shape: Any, tokens: int, dev: str, precision: Any, reps: int) -> list[float]:
    """The compute probe's kernels at the step's shapes, `reps` times after a warm-up (slowest rank each)."""
    replay = vf.replay(shape, tokens, dev, precision.param_dtype)
    replay.time_once(world)
    samples = [replay.time_once(world) for _ in range(reps)]
    del replay
    return samples


def predict_step(world: World, shape: Any, tokens: int, precision: Any, probes: dict[str, Any], before: list[float],
                 after: list[float], cal: vf.Calibration) -> dict[str, Any]:
    """verify fsdp's step prediction. The compute samples are taken right before and right after
    the job, half each: the machine's speed drifts by tens of percent within a minute here, and
    samples on both sides put the job's own stretch of that drift into the input (verify fsdp
    interleaves them with its steps; in a job that would stop its clock and let a mount's uploads
    run on meanwhile)."""
    samples = before + after
    compute = vf.compute_input(shape, tokens, samples)
    pred = vf.predict(shape, tokens, world.size, precision, compute, probes["collectives"], probes["optimizer"], cal)
    return {"step_s": pred["step_s"], "predicted": pred, "replay_before_s": before, "replay_after_s": after,
            "source": f"verify fsdp's step prediction: compute probe (kernel replay at the step's shapes, "
                      f"{len(before)} right before the job and {len(after)} right after, median "
                      f"{percentile(samples, 50) * 1e3:.1f} ms), collectives at the unit sizes, AdamW at the shard "
                      f"size ({probes['optimizer']['memory_gbps']:.2f} GB/s), all in this run; calibration: "
                      f"{cal.source}"}
