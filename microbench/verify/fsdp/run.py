"""`verify fsdp` from the launching process: the record, one world per link profile (reshaping
the lab in between), the checkpoint world, the verdict; and what a rank does with its phase spec."""

from __future__ import annotations

import contextlib
import dataclasses
import tempfile
from pathlib import Path
from typing import Any, NoReturn

from ...core.errors import UsageError
from ...lab import namespaces as labmod, placement as labrun
from ...results import RecordWriter, new_record
from ...targets import native
from ...world import backends, environment as envmod
from ...world.backends import BackendChoice
from ...world.dist import World
from ...world.launch import check_local_world, detect_world
from ...world.policy import local_ranks
from .. import collector, launch, model as fm, noise
from ..checkpoint.sharded import check_ckpt_dir
from ..spec import CheckpointSpec, RankSpec, StepsSpec
from .phases import cal_key
from .plan import VerifyOptions, calibration_from, check_hybrid, check_memory
from .report import attach, print_report, verdict


def run_fsdp(opts: VerifyOptions) -> int:
    """Launch every phase of a verify run; exit code (RunError when outside the tolerance)."""
    shape_kwargs, tokens, steps, warmup = opts.shapes, opts.tokens, opts.steps, opts.warmup
    tol, ckpt_tol, ckpt_reps, timeout_s, profs = (
        opts.tolerance_pct,
        opts.ckpt_tolerance_pct,
        opts.ckpt_reps,
        opts.timeout_s,
        opts.profiles,
    )
    choice = backends.choose(opts.backend)
    lab = labmod.get(opts.lab) if opts.lab else None
    given = opts.nproc
    per_node = 1
    if lab is not None:
        nproc = labrun.place(lab.name, nproc=given).nproc
        per_node = lab.ranks_per_host
    else:
        nproc = given or local_ranks()
        per_node = nproc  # microbench's own local ranks: one node
    check_hybrid(opts.shardings, nproc // per_node, per_node)
    cal = calibration_from(opts.calibration, choice.backend, choice.device) if opts.calibration else None
    if opts.calibrate_only and cal is not None:
        raise UsageError("--calibrate-only measures a calibration; it takes no --calibration")
    if lab is None and detect_world() is None:
        check_local_world(nproc)  # before the memory check, which scales with nproc
    check_memory(shape_kwargs, tokens, nproc, choice)
    checkpoint = opts.checkpoint
    if checkpoint and opts.ckpt_dir:
        check_ckpt_dir(opts.ckpt_dir)
    configs = [(name, t) for name in shape_kwargs for t in tokens]
    config = {
        "models": {n: fm.shape_from_args(**k).describe() for n, k in shape_kwargs.items()},
        "tokens": tokens,
        "profiles": [p for p, _ in profs],
        "lab": opts.lab,
        "ranks": nproc,
        "shardings": opts.shardings,
        "ranks_per_node": per_node,
        "steps": steps,
        "warmup": int(warmup),
        "tolerance_pct": tol,
        "ckpt_tolerance_pct": ckpt_tol,
        "checkpoint": checkpoint,
        "calibration": opts.calibration,
        "cal_reps": opts.cal_reps,
        "backend": choice.backend,
        "device": choice.device,
        "precision": dataclasses.asdict(fm.precision_for(choice.device)),
    }
    kind = "calibration" if opts.calibrate_only else "verify"  # the kinds `compose --calibration` takes
    record = new_record(
        kind,
        config,
        envmod.collect(),
        {
            **native.implementation(),
            "engine": "torch fully_shard (FSDP2) + torch.distributed.checkpoint",
            "model": fm.FAMILY,
            "backend": choice.backend,
            "device": choice.device,
            "gc": collector.NOTE,
        },
    )
    path = RecordWriter(record, opts.json, opts.results_dir).path
    base = RankSpec(
        device=choice.device,
        backend=choice.backend,
        record=str(path),
        timeout_s=timeout_s,
        nproc=nproc,
        calibration=cal,
        cal_reps=opts.cal_reps,
        calibration_source=f"--calibration {opts.calibration}" if opts.calibration else None,
    )
    print(
        f"# verify fsdp: {nproc} ranks ({choice.backend}/{choice.device}), "
        f"{'calibration only' if opts.calibrate_only else f'{len(configs)} configuration(s) x {len(profs)} profile(s)'}"
        f"{f' x {len(opts.shardings)} shardings' if len(opts.shardings) > 1 else ''}"
        f"{', checkpoint to a directory and S3' if checkpoint else ''}; record {path}",
        flush=True,
    )
    # A signal or a failed phase must not leave the record "running".
    with launch.partial_unless_finished(path):
        try:
            for label, rate in profs:
                if lab is not None:
                    labmod.shape(lab.name, rate, lab.delay_ms)
                for sharding in opts.shardings:
                    key = cal_key(label, sharding)
                    phase_cal = cal
                    if cal is not None and key in (cal.get("profiles") or {}):
                        phase_cal = {**cal, **cal["profiles"][key]}  # measured under this very profile
                    spec = StepsSpec(
                        **_fields(base),
                        calibration=phase_cal,
                        shapes=shape_kwargs,
                        configs=configs,
                        steps=steps,
                        warmup=int(warmup),
                        calibrate_only=opts.calibrate_only,
                        profile=label,
                        sharding=sharding,
                    )
                    code = launch.launch(spec, choice, lab=opts.lab)
                    if code != 0:
                        return launch.left_partial(path, code)
            if checkpoint:
                code = _checkpoint_phase(
                    opts.ckpt_dir, base, opts.shardings, shape_kwargs, choice, ckpt_reps, opts.state_dicts, per_node
                )
                if code != 0:
                    return launch.left_partial(path, code)
        finally:
            if lab is not None:
                labmod.shape(lab.name, lab.rate_bps, lab.delay_ms)
    return _finish(path, tol, ckpt_tol, opts.calibrate_only, cal)


def _fields(spec: RankSpec) -> dict[str, Any]:
    """The common fields of a phase's spec, to build the phase's own from (calibration aside)."""
    out = {f.name: getattr(spec, f.name) for f in dataclasses.fields(RankSpec)}
    out.pop("calibration")
    return out


def _checkpoint_phase(
    ckpt_dir: str | None,
    base: RankSpec,
    shardings: list[str],
    shape_kwargs: dict[str, Any],
    choice: BackendChoice,
    reps: int,
    state_dicts: list[str],
    per_node: int = 1,
) -> int:
    """On loopback (the storage path, not the lab's links): the largest model of the run."""
    from ...run.provision import ENV_ENDPOINT, ENV_KEY, ENV_ROOT, ENV_SECRET
    from ...targets import checkpoint_target as ct
    from ...targets.s3server import EmbeddedS3

    largest = max(shape_kwargs, key=lambda n: fm.shape_from_args(**shape_kwargs[n]).total_params)
    with contextlib.ExitStack() as stack:
        directory = ckpt_dir or stack.enter_context(tempfile.TemporaryDirectory(prefix="microbench-verify-ckpt-"))
        ct.preflight_local(ct.parse_target(directory), 64 << 20)
        server = stack.enter_context(EmbeddedS3(bucket="microbench"))
        env = {
            ENV_ENDPOINT: server.endpoint_url,
            ENV_KEY: server.credentials.access_key_id,
            ENV_SECRET: server.credentials.secret_access_key,
            ENV_ROOT: str(server.root),
        }
        spec = CheckpointSpec(
            **_fields(base),
            calibration=base.calibration,
            shape=shape_kwargs[largest],
            shardings=shardings,
            reps=reps,
            state_dicts=state_dicts,
            targets=[("directory", directory), ("s3", "s3://microbench/verify")],
        )
        return launch.launch(
            spec,
            dataclasses.replace(choice, env={**choice.env, **env}),
            per_node=per_node if "hybrid" in shardings else None,
            helpers=[server.pid],
        )


def run_phase(path: str) -> NoReturn:
    """A rank's side: the phase its spec file names."""

    def body(world: World, spec: RankSpec) -> int:
        if isinstance(spec, CheckpointSpec):
            from ..checkpoint.sharded import run_checkpoints

            return run_checkpoints(world, spec)
        from .phases import run_steps

        assert isinstance(spec, StepsSpec)
        return run_steps(world, spec)

    launch.run_rank(path, body)


def _finish(path: Path, tol: float, ckpt_tol: float, calibrate_only: bool, given: dict[str, Any] | None) -> int:
    writer = RecordWriter.resume(path)  # as the phases' rank 0 left it

    def summarize(record: dict[str, Any]) -> None:
        by_profile = record["summary"].get("calibration_by_profile") or {}
        if given is not None:
            record["summary"]["calibration"] = given  # what the predictions used, for compose too
        elif by_profile:
            first = next(iter(by_profile.values()))
            record["summary"]["calibration"] = {
                **first,
                "profiles": {
                    k: {
                        "overlap": v["overlap"],
                        "unit_overhead_s": v["unit_overhead_s"],
                        "compute_efficiency": v["compute_efficiency"],
                    }
                    for k, v in by_profile.items()
                },
            }
        if not calibrate_only:
            judged = verdict(record["rows"], tol, ckpt_tol, record["summary"].get("load_by_phase"))
            record["summary"]["verdict"] = judged
            attach(record, judged)

    writer.update(summarize)
    writer.finish("complete")
    record = writer.record
    print_report(record, calibrate_only)
    print(f"# results: {path}")
    if calibrate_only:
        return 0
    return noise.exit_for(record["summary"]["verdict"], path)
