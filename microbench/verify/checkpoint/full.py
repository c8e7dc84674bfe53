"""Checkpoint verification of a full state dict save, rank side: the trained FSDP2 model and its
AdamW state gathered to rank 0 (get_state_dict full_state_dict + cpu_offload), written there with
torch.save and made durable (fsync; on S3 the upload's completion), then read on rank 0 and
scattered back (set_state_dict full_state_dict + broadcast_from_rank0), as Hugging Face
Accelerate/Trainer's FULL_STATE_DICT does. Predicted by the composer (compose.full_save.full_save)
from the checkpoint probe's `--state-dict full` run on the same target in this invocation: its
gather time, its serialize+write rate (one process's serialization) and its serialize+write+fsync
rate (the tier's single stream), a synthetic state in this state's layout, one probe save and
load right before each real one, medians. The load is predicted as the probe's read on rank 0
plus this model's own scatter timed without a file (the sharded load's state-dict conversion is
timed on the model the same way).
"""

from __future__ import annotations

import io
import os
import time
from typing import Any

from ...compose.checkpoint.full import full_save
from ...core.stats import percentile
from ...probes import checkpoint as ck
from ...probes.checkpoint import state_layout as ckl
from ...targets import checkpoint_target as ct
from ...world.dist import World
from .. import collector
from ..fsdp.steps import error_pct, paired_error_pct, spread_pct, sync


def _checksum(model: Any) -> float:
    return float(sum(p.to_local().double().sum().item() for p in model.parameters()))


def _save(world: World, run_dir: ct.RunDir, sub: str, model: Any, optim: Any, dev: str) -> tuple[float, float, float]:
    """One real full save: (total, gather, write+durable) seconds; rank 0 writes."""
    import torch
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    local = run_dir.target.kind == "local"
    path = os.path.join(run_dir.sub(sub), "state.pt") if local else f"{run_dir.root}/{sub}/state.pt"
    if world.rank == 0 and local:
        os.makedirs(os.path.dirname(path), exist_ok=True)
    world.barrier()
    start = time.perf_counter()
    msd, osd = get_state_dict(model, optim, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    sync(dev)
    gathered = time.perf_counter()
    if world.rank == 0:
        if local:
            torch.save({"model": msd, "optim": osd}, path)
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        else:
            with run_dir.fs().open(path, "wb") as handle:
                torch.save({"model": msd, "optim": osd}, handle)
    del msd, osd
    world.barrier()
    end = time.perf_counter()
    return end - start, gathered - start, end - gathered


def _load(world: World, run_dir: ct.RunDir, sub: str, model: Any, optim: Any, dev: str) -> tuple[float, float]:
    """One real full load: (total, read on rank 0) seconds; the rest is the scatter."""
    import torch

    local = run_dir.target.kind == "local"
    path = os.path.join(run_dir.sub(sub), "state.pt") if local else f"{run_dir.root}/{sub}/state.pt"
    if world.rank == 0:
        run_dir.drop_page_cache(sub)
    world.barrier()
    start = time.perf_counter()
    saved: dict[str, Any] = {"model": {}, "optim": {}}
    if world.rank == 0:
        source = path if local else io.BytesIO(run_dir.fs().cat_file(path))
        saved = torch.load(source, map_location="cpu", weights_only=True)
    read = time.perf_counter()
    _scatter(model, optim, saved["model"], saved["optim"], dev)
    return time.perf_counter() - start, read - start


def _scatter(model: Any, optim: Any, msd: dict[str, Any], osd: dict[str, Any], dev: str) -> None:
    """Rank 0's full state into every rank's shards (every other rank passes empty dicts)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_optimizer_state_dict

    # Two calls, not set_state_dict: given an empty model state dict (every rank but 0) it
    # takes the call for an optimizer-only load and skips the model's broadcast, a hang.
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(model, msd, options=options)
    set_optimizer_state_dict(model, optim, osd, options=options)
    sync(dev)


def _scatter_alone(world: World, model: Any, optim: Any, dev: str) -> float:
    """The full load's scatter on this model with its own state gathered to rank 0 and no file:
    set_model_state_dict + set_optimizer_state_dict (broadcast_from_rank0), each rank's time.
    The probe's scatter, one set_model_state_dict over a module of synthetic tensors in the
    state's layout, skips the optimizer's own state-dict code (its FQN mapping and per-state
    distribution), which costs a real load measurably more (docs/verify.md); the sharded load's
    state-dict conversion is timed on the model the same way."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    msd, osd = get_state_dict(model, optim, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if world.rank != 0:
        msd, osd = {}, {}
    world.barrier()
    start = time.perf_counter()
    _scatter(model, optim, msd, osd, dev)
    return time.perf_counter() - start


def run_full_target(world: World, run_dir: ct.RunDir, label: str, model: Any, optim: Any, dev: str, backend: str,
                    reps: int) -> dict[str, Any]:
    import torch
    from torch.distributed.checkpoint.state_dict import get_state_dict

    msd, osd = get_state_dict(model, optim)
    layout = ckl.state_layout({"model": msd, "optim": osd})
    del msd, osd
    nbytes = ckl.layout_bytes(layout, world.size)
    probe = ck.CheckpointProbe(ck.Config(size_bytes=nbytes, target=run_dir.display, dtype="float32", device=dev,
                                         backend=backend, items=tuple(layout), state_dict="full",
                                         save_format="torch"), world, run_dir)
    save_case, load_case = probe.cases()
    probe_parts: list[tuple[float, float, float]] = []
    probe_loads, probe_reads, saves, gathers, writes, loads, reads, wrong = [], [], [], [], [], [], [], 0
    scatters: list[float] = []
    saved_sum = _checksum(model)
    try:
        for i in range(reps + 1):
            collector.young()   # between repetitions, outside every clock (collector.py)
            probe._fresh_step()
            assert probe.full is not None   # the probe was made for a full state dict
            _, parts = probe.full.save()
            probe_parts.append((parts.get("gather_time_us", 0.0) / 1e6, parts.get("serialize_write_time_us", 0.0) / 1e6,
                                parts.get("fsync_time_us", 0.0) / 1e6))
            probe.prepare(load_case)
            timed = probe.run_once(load_case)
            probe_loads.append(timed.time_s)
            probe_reads.append(timed.extra.get("read_time_us", 0.0) / 1e6 if world.rank == 0 else 0.0)
            scatters.append(_scatter_alone(world, model, optim, dev))
            sub = f"verify-full-step-{i}"
            world.barrier()
            if world.rank == 0 and i > 0:
                run_dir.remove_sub(f"verify-full-step-{i - 1}")
            world.barrier()
            total, gather, write = _save(world, run_dir, sub, model, optim, dev)
            saves.append(total)
            gathers.append(gather)
            writes.append(write)
            with torch.no_grad():
                for p in model.parameters():
                    p.to_local().zero_()
            load_s, read_s = _load(world, run_dir, sub, model, optim, dev)
            loads.append(load_s)
            reads.append(read_s)
            wrong += int(abs(_checksum(model) - saved_sum) > 1e-6 * (abs(saved_sum) + 1))
    except BaseException:
        probe.abandon(load_case)   # no collective: a peer may be inside any of the above
        raise
    probe.release(load_case)
    # The first of each warms up. The probe's parts are rank 0's (the writer); times the slowest rank's.
    parts = world.broadcast_object(probe_parts[1:] if world.rank == 0 else None)
    gather_in = percentile([p[0] for p in parts], 50)
    serialize_in = percentile([p[1] for p in parts], 50)
    durable_in = percentile([p[1] + p[2] for p in parts], 50)
    per_rank = world.all_gather_object((saves[1:], gathers[1:], writes[1:], loads[1:], probe_loads[1:], reads[1:],
                                        probe_reads[1:], scatters[1:]))

    def slowest(k: int) -> list[float]:
        return [max(r[k][i] for r in per_rank) for i in range(reps)]

    save_t, gather_t, write_t, load_t, probe_load_t, read_t, probe_read_t, scatter_t = (slowest(k) for k in range(8))

    def composed(gather_s: float, serialize_s: float, durable_s: float) -> Any:
        """The composer's full save from the probe's gather, serialize+write and write+fsync times."""
        return full_save(label, probe.size, gather_time_s=gather_s, host_link_gbps=None,
                         serialize_gbps=probe.size / serialize_s / 1e9, stream_gbps=probe.size / durable_s / 1e9,
                         aggregate_gbps=probe.size / durable_s / 1e9, nodes=1, aggregate_is_job=False)

    pred = composed(gather_in, serialize_in, durable_in)
    # The load: the probe's read on rank 0 (the storage and torch.load) and this model's own
    # scatter timed alone (_scatter_alone), medians.
    pred_read, pred_scatter = percentile(probe_read_t, 50), percentile(scatter_t, 50)
    pred_load = pred_read + pred_scatter
    # Each real save and load against the composer's prediction from the probe's parts (and the
    # scatter) timed right before it.
    save_each = [composed(g, w, w + f).save_s for g, w, f in parts]
    load_each = [r + c for r, c in zip(probe_read_t, scatter_t, strict=False)]
    save_s, load_s = percentile(save_t, 50), percentile(load_t, 50)
    wrong = sum(world.all_gather_object(wrong))
    source = (f"checkpoint probe --state-dict full on {label} in this run: {format(probe.size, ',')} bytes in "
              f"{probe.tensors} synthetic tensors in this state's layout, one probe save and load right before each "
              f"real one, medians: gather {gather_in:.3f} s, serialize+write {probe.size / serialize_in / 1e9:.3f} "
              f"GB/s, with fsync {probe.size / durable_in / 1e9:.3f} GB/s")
    return {
        "kind": "checkpoint",
        "target": f"{label} full",
        "state_dict": "full",
        "save_format": "torch",
        "bytes": nbytes,
        "tensors": ckl.tensor_count(layout),
        "ranks": world.size,
        "wrong_loads": wrong,
        "save": {
            "predicted_s": pred.save_s,
            "measured_s": save_s,
            "measured_s_each": save_t,
            "predicted_s_each": save_each,
            "spread_pct": spread_pct(save_t),
            "error_pct": paired_error_pct(save_each, save_t),
            "error_of_medians_pct": error_pct(pred.save_s, save_s),
            "parts": {
                "gather": {"predicted_s": pred.gather_s, "measured_s": percentile(gather_t, 50)},
                "serialize_write_fsync": {"predicted_s": pred.write_s, "measured_s": percentile(write_t, 50)},
            },
        },
        "load": {
            "predicted_s": pred_load,
            "measured_s": load_s,
            "measured_s_each": load_t,
            "predicted_s_each": load_each,
            "spread_pct": spread_pct(load_t),
            "error_pct": paired_error_pct(load_each, load_t),
            "error_of_medians_pct": error_pct(pred_load, load_s),
            "parts": {
                "read": {
                    "predicted_s": pred_read,
                    "measured_s": percentile(read_t, 50),
                    "predicted_s_each": probe_read_t,
                    "measured_s_each": read_t,
                },
                "scatter": {
                    "predicted_s": pred_scatter,
                    "measured_s": load_s - percentile(read_t, 50),
                    "predicted_s_each": scatter_t,
                },
            },
        },
        "inputs": {
            "storage": {
                "source": source,
                "gather_s": gather_in,
                "serialize_write_s": serialize_in,
                "serialize_write_fsync_s": durable_in,
                "size_bytes": probe.size,
                "probe_load_s": percentile(probe_load_t, 50),
                "probe_load_s_each": probe_load_t,
            },
            "scatter": {
                "source": "set_model_state_dict + set_optimizer_state_dict (full_state_dict, "
                "broadcast_from_rank0) of this model with its own state gathered to rank 0, "
                "no file, timed right after each probe load, median",
                "time_s": pred_scatter,
                "time_s_each": scatter_t,
            },
        },
    }
