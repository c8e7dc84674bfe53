"""Checkpoint verification, rank side: a real DCP save and load of a trained FSDP2 model and its
AdamW state (the training checkpoint) to a directory and to S3, predicted from the checkpoint
probe run on the same target in the same invocation.

Prediction: the composer's tier model (`compose.checkpoint.predict_tier`): bytes over the
aggregate write (read) bandwidth the checkpoint probe measured for a synthetic state dict in the
real state's layout on the same target; the load adds the state-dict conversion around dcp.load
(get_state_dict + set_state_dict, timed on the model without a load). Measured: `dcp.save` of
`get_state_dict(model, optimizer)` into a fresh step directory, and `dcp.load` plus
`set_state_dict` after evicting the files' cached pages, each from a barrier to the slowest
rank's return. The load is checked: the model's parameters after it equal those saved.
"""

from __future__ import annotations

import functools
import time
from typing import Any

from ...compose.checkpoint.tier import predict_tier
from ...core.stats import percentile
from ...probes import checkpoint as ck
from ...probes.checkpoint import state_layout as ckl
from ...results.store import RecordWriter
from ...targets import checkpoint_target as ct
from ...world.dist import World
from .. import collector, model as fm
from ..fsdp.phases import device_of, guarded, quiet
from ..fsdp.steps import error_pct, paired_error_pct, spread_pct, sync
from ..spec import CheckpointSpec


def check_ckpt_dir(directory: str, size_bytes: int = 64 << 20) -> None:
    """`verify fsdp --ckpt-dir`, checked before any training: a directory that can be written
    and has room, refused with exit 2 under the flag's own name (the checkpoint probe's
    preflight speaks of --target, a flag verify does not have)."""
    from ...core.errors import MicrobenchError, UsageError

    try:
        ct.preflight_local(ct.parse_target(directory), size_bytes)
    except MicrobenchError as exc:
        raise UsageError(str(exc).replace("--target", "--ckpt-dir")) from None


def _checksum(model: Any) -> float:
    return float(sum(p.to_local().double().sum().item() for p in model.parameters()))


def run_target(world: World, run_dir: ct.RunDir, label: str, model: Any, optim: Any, dev: str, backend: str,
               reps: int) -> dict[str, Any]:
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    msd, osd = get_state_dict(model, optim)
    state = {"model": msd, "optim": osd}
    layout = ckl.state_layout(state)
    nbytes, items = ckl.layout_bytes(layout, world.size), ckl.tensor_count(layout)
    # The input: the checkpoint probe on this target, a synthetic state dict in this state's
    # layout: the same top-level keys, tensor shapes, sharding and order (DCP pays per item in
    # planning and metadata, and an S3 load's read-ahead windows follow the items' sizes and
    # order: equal tensors under sorted flat keys made the probe fetch far more per rank than this
    # state does, docs/verify.md), saved the same way (one file per rank and the metadata,
    # fsync'd). One probe save and load right before each
    # real save and load: the page cache's flush and other work on the machine move a save by
    # tens of percent from one minute to the next, and alternating puts that into both sides.
    probe = ck.CheckpointProbe(ck.Config(size_bytes=nbytes, target=run_dir.display, dtype="float32",
                                         device=dev, backend=backend, items=tuple(layout)), world, run_dir)
    save_case, load_case = probe.cases()
    probe_saves, probe_loads, converts = [], [], []
    saves, loads, wrong = [], [], 0
    saved_sum = _checksum(model)
    try:
        for i in range(reps + 1):
            collector.young()   # between repetitions, outside every clock (collector.py)
            # The real load is get_state_dict, dcp.load, set_state_dict; the probe times the
            # storage part only. The state-dict conversion around it, timed here on this model
            # with its own state (no load), is the other input: a sizeable share of a small
            # state's directory load.
            world.barrier()
            start = time.perf_counter()
            msd, osd = get_state_dict(model, optim)
            set_state_dict(model, optim, model_state_dict=msd, optim_state_dict=osd)
            sync(dev)
            converts.append(time.perf_counter() - start)
            msd, osd = get_state_dict(model, optim)
            state = {"model": msd, "optim": osd}
            probe.prepare(save_case)
            probe_saves.append(probe.run_once(save_case).time_s)
            probe.prepare(load_case)
            probe_loads.append(probe.run_once(load_case).time_s)
            sub = f"verify-step-{i}"
            # The previous checkpoint goes right before this save, as the probe removes its own
            # right before its save: freeing 100 MB of files costs the file system work that
            # spills into whatever comes next, so each side pays it at the same point.
            world.barrier()
            if world.rank == 0 and i > 0:
                run_dir.remove_sub(f"verify-step-{i - 1}")
            world.barrier()
            start = time.perf_counter()
            dcp.save(state, storage_writer=run_dir.writer(sub, 1), process_group=world.control)
            sync(dev)
            saves.append(time.perf_counter() - start)
            with torch.no_grad():
                for p in model.parameters():
                    p.to_local().zero_()
            world.barrier()
            if world.rank == 0:
                run_dir.drop_page_cache(sub)
            world.barrier()
            start = time.perf_counter()
            msd, osd = get_state_dict(model, optim)
            loaded: dict[str, Any] = {"model": msd, "optim": osd}
            dcp.load(loaded, storage_reader=run_dir.reader(sub), process_group=world.control)
            set_state_dict(model, optim, model_state_dict=loaded["model"], optim_state_dict=loaded["optim"])
            sync(dev)
            loads.append(time.perf_counter() - start)
            wrong += int(abs(_checksum(model) - saved_sum) > 1e-6 * (abs(saved_sum) + 1))
        written = written_bytes(world, run_dir, f"verify-step-{reps}")
    except BaseException:
        probe.abandon(load_case)   # no collective: a peer may be inside any of the above
        raise
    probe.release(load_case)
    # the first of each (probe and real) warms up; each value is the slowest rank's
    per_rank_probe = world.all_gather_object((probe_saves[1:], probe_loads[1:], converts[1:]))
    probe_save_t = [max(r[0][i] for r in per_rank_probe) for i in range(reps)]
    probe_load_t = [max(r[1][i] for r in per_rank_probe) for i in range(reps)]
    convert_t = [max(r[2][i] for r in per_rank_probe) for i in range(reps)]
    convert_s = percentile(convert_t, 50)
    write_gbps = probe.size / percentile(probe_save_t, 50) / 1e9
    read_gbps = probe.size / percentile(probe_load_t, 50) / 1e9
    pred = predict_tier(label, probe.size, write_gbps, read_gbps)
    pred_load_s = (pred.load_s or 0.0) + convert_s
    per_rank = world.all_gather_object((saves[1:], loads[1:]))   # the first of each warms up
    save_t = [max(r[0][i] for r in per_rank) for i in range(reps)]
    load_t = [max(r[1][i] for r in per_rank) for i in range(reps)]
    wrong = sum(world.all_gather_object(wrong))
    save_s, load_s = percentile(save_t, 50), percentile(load_t, 50)
    # Each real save and load against the composer's prediction from the probe save and load
    # (and the state-dict conversion) timed right before it.
    each = [predict_tier(label, probe.size, probe.size / ps / 1e9, probe.size / pl / 1e9)
            for ps, pl in zip(probe_save_t, probe_load_t, strict=False)]
    save_each = [p.save_s for p in each]
    load_each = [(p.load_s or 0.0) + c for p, c in zip(each, convert_t, strict=False)]
    source = (f"checkpoint probe on {label} in this run: {format(probe.size, ',')} bytes in {probe.tensors} "
              f"synthetic tensors in this state's layout, one probe save and load right before each real one, medians: "
              f"save {write_gbps:.3f} GB/s, load {read_gbps:.3f} GB/s")
    return {
        "kind": "checkpoint",
        "target": label,
        "bytes": nbytes,
        "tensors": items,
        "ranks": world.size,
        "wrong_loads": wrong,
        "written_bytes": written,
        "save": {
            "predicted_s": pred.save_s,
            "measured_s": save_s,
            "measured_s_each": save_t,
            "predicted_s_each": save_each,
            "spread_pct": spread_pct(save_t),
            "error_pct": paired_error_pct(save_each, save_t),
            "error_of_medians_pct": error_pct(pred.save_s, save_s),
        },
        "load": {
            "predicted_s": pred_load_s,
            "measured_s": load_s,
            "measured_s_each": load_t,
            "predicted_s_each": load_each,
            "spread_pct": spread_pct(load_t),
            "error_pct": paired_error_pct(load_each, load_t),
            "error_of_medians_pct": error_pct(pred_load_s, load_s),
            "predicted_storage_s": pred.load_s,
            "predicted_state_dict_s": convert_s,
        },
        "inputs": {
            "storage": {
                "source": source,
                "write_gbps": write_gbps,
                "read_gbps": read_gbps,
                "size_bytes": probe.size,
                "probe_save_s_each": probe_save_t,
                "probe_load_s_each": probe_load_t,
                "save_spread_pct": spread_pct(probe_save_t),
                "load_spread_pct": spread_pct(probe_load_t),
            },
            "state_dict": {
                "source": "get_state_dict + set_state_dict of this model and optimizer with their "
                "own state (no load), timed right before each probe save, median",
                "time_s": convert_s,
                "time_s_each": convert_t,
                "spread_pct": spread_pct(convert_t),
            },
        },
    }


def written_bytes(world: World, run_dir: ct.RunDir, sub: str) -> int:
    """The bytes the save stored, from its DCP metadata (every stored chunk once): with HSDP, the
    replicas hold the same shards and DCP writes each once (dedup), so this is one copy."""
    total = None
    if world.rank == 0:
        metadata = run_dir.reader(sub).read_metadata()
        total = sum(int(info.length) for info in metadata.storage_data.values())
    return world.broadcast_object(total)


def run_checkpoints(world: World, spec: CheckpointSpec) -> int:
    quiet()
    with collector.as_trainer():
        for sharding in spec.shardings or ["full"]:
            checkpoint_sharding(world, spec, sharding)
    return 0


def checkpoint_sharding(world: World, spec: CheckpointSpec, sharding: str) -> None:
    """Save and load the state of the model sharded one way (full, or hybrid: HSDP's 2-D mesh)."""
    import torch

    from ..fsdp import hybrid

    dev, backend = spec.device, spec.backend
    device = device_of(dev)
    precision = fm.precision_for(dev)
    record = RecordWriter.resume(spec.record) if world.rank == 0 else None
    shape = fm.shape_from_args(**spec.shape)
    layout = hybrid.layout_for(sharding, world.size)
    torch.manual_seed(0)
    model = fm.shard(fm.build(shape, device), precision, mesh=hybrid.mesh(layout, device) if layout.hybrid else None)
    optim = fm.optimizer(model)
    ids, targets = fm.batch(shape, 64, device, seed=world.rank)
    fm.step(model, optim, ids, targets)     # optimizer state exists only after a step
    # A full state dict of an HSDP model is the same gather as full sharding's: only the sharded save differs.
    state_dicts = (spec.state_dicts or ["sharded"]) if not layout.hybrid else ["sharded"]
    for label, target_text in spec.targets:
        target = ct.parse_target(target_text)
        access = None
        if target.kind == "s3":
            import os

            from ...run.provision import ENV_ENDPOINT, ENV_KEY, ENV_ROOT, ENV_SECRET

            access = ct.S3Access(os.environ[ENV_ENDPOINT], os.environ.get(ENV_KEY), os.environ.get(ENV_SECRET),
                                 embedded=True, root_dir=os.environ.get(ENV_ROOT))
        name = world.broadcast_object(ct.unique_name() if world.rank == 0 else None)
        run_dir = ct.RunDir(target, name, access)
        if world.rank == 0:
            run_dir.create()
        world.barrier()
        rows = []
        try:
            for state_dict in state_dicts:
                if state_dict == "full":
                    from .full import run_full_target as run_one
                else:
                    run_one = run_target
                rows.append(guarded(world, record, f"the {state_dict} checkpoint to {label}",
                                    functools.partial(run_one, world, run_dir, label, model, optim, dev, backend,
                                                      spec.reps)))
                world.barrier()
        finally:
            if world.rank == 0:
                run_dir.remove()
        for row in rows:
            row["model"] = shape.name
            row["sharding"] = sharding
            row.setdefault("state_dict", "sharded")
            if layout.hybrid and layout.topo is not None:
                row["replicas"] = layout.topo.nodes
            if record is not None:
                record.add_rows([row])
                def shown(op: dict[str, Any]) -> str:
                    return "".join(f"; {name} predicted {p['predicted_s']:.3f} s, measured {p['measured_s']:.3f} s"
                                   for name, p in (op.get("parts") or {}).items())
                where = row["target"] + (f" {sharding}" if sharding != "full" else "")
                stored = (f"; stored {row['written_bytes'] / 1e6:.1f} MB for {row['replicas']} replicas"
                          if row.get("replicas") and row.get("written_bytes") is not None else "")
                print(f"# [checkpoint {where}] {row['bytes'] / 1e6:.1f} MB{stored}: save predicted "
                      f"{row['save']['predicted_s']:.3f} s, measured {row['save']['measured_s']:.3f} s "
                      f"({row['save']['error_pct']:+.1f}%){shown(row['save'])}; load predicted "
                      f"{row['load']['predicted_s']:.3f} s, measured {row['load']['measured_s']:.3f} s "
                      f"({row['load']['error_pct']:+.1f}%){shown(row['load'])}", flush=True)
