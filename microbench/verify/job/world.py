"""verify job, what the ranks of one link profile run: the calibration (unless given), then every
storage assignment: its tiers prepared, the probes, the prediction, the job, the row. Rank 0
appends each finished row to the record; a rank that dies mid-job leaves a partial row with the
phases finished so far, and the record partial naming the rank."""

from __future__ import annotations

from typing import Any

from ...compose.job.timeline import JobPlan
from ...results.store import RecordWriter
from ...world.dist import World
from .. import model as fm
from ..fsdp import calibrate as vc
from ..fsdp.phases import device_of, guarded, quiet
from ..spec import JobSpec
from . import inputs as ji, rank as jr
from .plan import Assignment
from .tiers import Place, os_threads, threads_settled

REPLAYS = 3   # compute probe samples on each side of the job


def run_profile(world: World, spec: JobSpec) -> int:
    quiet()
    dev, backend, profile = spec.device, spec.backend, spec.profile
    device = device_of(dev)
    precision = fm.precision_for(dev)
    record = RecordWriter.resume(spec.record) if world.rank == 0 else None
    if spec.calibration is not None:
        cal_dict, source = spec.calibration, spec.calibration_source or "--calibration"
    else:
        cal_dict = guarded(world, record, f"the calibration ({profile})",
                           lambda: vc.calibrate(world, device, precision, dev, backend, reps=spec.cal_reps))
        source = (f"calibrated in this run on {vc.CAL_SHAPE.name} ({vc.CAL_TOKENS} tokens) and tiny units, {profile} "
                  f"(another model than the job's)")
        if record is not None:
            record.update(
                lambda r: r["summary"].setdefault("calibration_by_profile", {}).__setitem__(profile, cal_dict)
            )
    cal = vc.as_calibration(cal_dict, source)
    shape = fm.shape_from_args(**spec.shape)
    for a in spec.assignments:
        label = f"{profile} {a.label}"
        progress: dict[str, Any] = {}

        def attempt(a: Assignment = a, progress: dict[str, Any] = progress) -> dict[str, Any]:
            try:
                return one_config(world, spec, a, shape, device, precision, cal, progress)
            except BaseException:
                if record is not None and progress:
                    # The phases finished before the failure, as rank 0 saw them (its own times).
                    record.add_rows([{"kind": "job", "status": "partial", "profile": profile, "assignment": a.label,
                                      "model": shape.name, "finished_phases_rank0": dict(progress)}])
                raise

        row = guarded(world, record, label, attempt)
        if record is not None:
            record.add_rows([row])
            t = row["total"]
            print(
                f"# [{profile}] {a.label}: total predicted {t['predicted_s']:.2f} s, measured {t['measured_s']:.2f} s "
                f"({t['error_pct']:+.1f}%)",
                flush=True,
            )
    return 0


def one_config(world: World, spec: JobSpec, a: Assignment, shape: Any, device: Any, precision: Any, cal: Any,
               progress: dict[str, Any]) -> dict[str, Any]:
    dev, backend, tiers = spec.device, spec.backend, spec.tiers
    tokens, batch, workers = spec.tokens, spec.batch_size, spec.workers
    plan = JobPlan(steps=spec.steps, ckpt_every=spec.ckpt_every, async_ckpt=spec.async_ckpt,
                   tokens_per_step=tokens * world.size)
    names = world.broadcast_object([Place(t, tiers, w).name for t, w in
                                    ((a.model_from, "model"), (a.model_from, "modelprobe"), (a.data, "data"),
                                     (a.ckpt_to, "ckptprobe"), (a.ckpt_to, "ckpt"))] if world.rank == 0 else None)
    model_place, probe_place, data_place = (Place(a.model_from, tiers, "model", names[0]),
                                            Place(a.model_from, tiers, "modelprobe", names[1]),
                                            Place(a.data, tiers, "data", names[2]))
    probe_dir, job_dir = (Place(a.ckpt_to, tiers, "ckptprobe", names[3]).run_dir(),
                          Place(a.ckpt_to, tiers, "ckpt", names[4]).run_dir())
    dplan = jr.data_plan(world.size, batch, plan.steps, workers, spec.sample_bytes)
    state = ji.model_state(shape)
    keys: list[str] = []
    finished = False
    try:
        if world.rank == 0:
            from ...probes.dataload import dataset as ds

            model_place.create()
            keys = ji.write_model(model_place, state)
            model_place.settle(spec.timeout_s)
            data_place.create()
            if data_place.root is not None:   # a local tier: the ranks' files written here
                ds.write_local(dplan, data_place.root)
            else:
                ds.write_s3(dplan, data_place.client(), data_place.bucket, data_place.prefix)
            data_place.settle(spec.timeout_s)
            probe_dir.create()
            job_dir.create()
        keys = world.broadcast_object(keys if world.rank == 0 else None)
        expected_sum = jr.checksum(state)
        nbytes = jr.model_bytes(state)
        del state
        world.barrier()
        # The prediction's inputs, each a probe on this configuration's tiers.
        # The probes' files stay until the job is done: removing a few hundred MB costs the file
        # system work that spills into whatever runs next (verify/checkpoint/sharded.py saw the same).
        threads = os_threads()
        model_in = ji.probe_model_load(world, probe_place, ji.model_state(shape), dev, backend)
        threads_settled(threads)   # before the data probe's loader forks its workers
        data_in = ji.probe_data(world, data_place, dplan, workers, batch, dev)
        layout, fresh_in = ji.fresh_model_probe(shape, device, precision, tokens, world)
        ckpt_in = ji.probe_checkpoint(world, probe_dir, layout, plan.async_ckpt, dev, backend)
        probes = ji.step_probes(world, shape, device, dev, backend, precision)
        before = ji.replay_samples(world, shape, tokens, dev, precision, REPLAYS)
        progress["inputs_done"] = True
        world.barrier()
        measured = jr.run_job(world, shape, tokens, device, precision, plan, model_place, keys, expected_sum,
                              data_place, dplan, workers, batch, job_dir, progress, spec.timeout_s)
        after = ji.replay_samples(world, shape, tokens, dev, precision, REPLAYS)
        step_in = ji.predict_step(world, shape, tokens, precision, probes, before, after, cal)
        step_in["first_step_extra_s"] = fresh_in["first_step_extra_s"]
        tl, stall = jr.predict(plan, step_in, model_in, data_in, ckpt_in, batch, workers)
        finished = True
    finally:
        if finished:
            world.barrier()   # every rank done with the files (after a failure rank 0 cleans up alone)
        if world.rank == 0:
            for place in (model_place, probe_place, data_place):
                place.remove()
            for run_dir in (probe_dir, job_dir):
                run_dir.remove()
    phases, total = jr.compare(tl, measured)
    return {
        "kind": "job",
        "profile": spec.profile,
        "assignment": a.label,
        "data": a.data,
        "model_from": a.model_from,
        "ckpt_to": a.ckpt_to,
        "model": shape.name,
        "model_bytes": nbytes,
        "tokens": tokens,
        "ranks": world.size,
        "steps": plan.steps,
        "ckpt_every": plan.ckpt_every,
        "async_ckpt": plan.async_ckpt,
        "batch_size": batch,
        "sample_bytes": spec.sample_bytes,
        "workers": workers,
        "phases": phases,
        "total": total,
        "error_pct": total["error_pct"],
        "predicted_timeline": tl.as_dict(),
        "measured": {k: v for k, v in measured.items() if k not in ("phases_s",)},
        "inputs": {
            "fresh_model": fresh_in,
            "model_load": model_in,
            "data": {**data_in, "stall": stall},
            "checkpoint": ckpt_in,
            "step": step_in,
            "calibration": {
                "source": cal.source,
                "overlap": cal.overlap,
                "unit_overhead_s": cal.unit_overhead_s,
                "compute_efficiency": cal.compute_efficiency,
            },
        },
    }
