"""`verify job` from the launching process: the record, the tiers (a directory, the embedded S3
server, a cached rclone mount of a bucket on its own embedded server), one world per link profile
(reshaping the lab in between), the verdict. Whatever it started it stops and removes, on failure
and interruption too."""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any, NoReturn

from ...lab import namespaces as labmod, placement as labrun
from ...results import RecordWriter, new_record
from ...targets import native
from ...world import backends, environment as envmod
from ...world.backends import BackendChoice
from ...world.dist import World
from ...world.launch import check_local_world, detect_world
from ...world.policy import local_ranks
from .. import launch, model as fm, noise
from ..fsdp.plan import calibration_from, check_memory
from ..spec import JobSpec, JobTiers, RankSpec
from .plan import MATRIX_PROFILES, JobOptions
from .report import attach, print_report, verdict

S3_BUCKET, S3_PREFIX = "microbench", "verify-job"


def run_job(opts: JobOptions) -> int:
    choice = backends.choose(opts.backend)
    with contextlib.ExitStack() as lab_stack:
        if opts.matrix and opts.lab is None:
            opts = _own_lab(lab_stack, opts)
        return _run(opts, choice)


def _own_lab(stack: contextlib.ExitStack, opts: JobOptions) -> JobOptions:
    """--matrix without --lab: a two-host lab of its own for the link profiles, removed at the end;
    where namespaces are refused, the loopback profile alone, said in the record."""
    from ...core.errors import MicrobenchError
    from ...core.units import parse_link_rate

    name = f"vjob{uuid.uuid4().hex[:4]}"
    try:
        labmod.require()
        stack.callback(labmod.down, name)
        labmod.up(name, 2, None)
    except MicrobenchError as exc:
        return dataclasses.replace(opts, notes=[*opts.notes, f"one link profile only (loopback): no lab ({exc})"])
    profiles = [(label.strip(), parse_link_rate(label.strip())) for label in MATRIX_PROFILES.split(",")]
    return dataclasses.replace(
        opts,
        lab=name,
        nproc=opts.nproc or 2,
        profiles=profiles,
        notes=[*opts.notes, f"the link profiles run on lab {name} (2 hosts), made and removed by this run"],
    )


def _run(opts: JobOptions, choice: BackendChoice) -> int:
    lab = labmod.get(opts.lab) if opts.lab else None
    given = opts.nproc
    nproc = labrun.place(lab.name, nproc=given).nproc if lab is not None else (given or local_ranks())
    if lab is None and detect_world() is None:
        check_local_world(nproc)
    check_memory({"job": opts.shape}, [opts.tokens], nproc, choice)
    shape = fm.shape_from_args(**opts.shape)
    cal = calibration_from(opts.calibration, choice.backend, choice.device) if opts.calibration else None
    tiers_used = sorted({t for a in opts.assignments for t in a.tiers()})
    config = {
        "model": shape.describe(),
        "tokens": opts.tokens,
        "steps": opts.steps,
        "ckpt_every": opts.ckpt_every,
        "async_ckpt": opts.async_ckpt,
        "assignments": [a.label for a in opts.assignments],
        "tiers": tiers_used,
        "profiles": [p for p, _ in opts.profiles],
        "lab": opts.lab,
        "ranks": nproc,
        "batch_size": opts.batch_size,
        "sample_bytes": opts.sample_bytes,
        "workers": opts.workers,
        "write_back_s": opts.write_back_s,
        "tolerance_pct": opts.tolerance_pct,
        "matrix": opts.matrix,
        "calibration": opts.calibration,
        "cal_reps": opts.cal_reps,
        "backend": choice.backend,
        "device": choice.device,
        "notes": opts.notes,
    }
    record = new_record(
        "verify",
        config,
        envmod.collect(),
        {
            **native.implementation(),
            "engine": "a short FSDP2 training job (safetensors load, "
            "DataLoader over WebDataset shards, DCP checkpoints) vs compose/job.timeline",
            "model": fm.FAMILY,
            "backend": choice.backend,
            "device": choice.device,
        },
    )
    path = RecordWriter(record, opts.json, opts.results_dir).path
    print(
        f"# verify job: {nproc} ranks ({choice.backend}/{choice.device}), {shape.name}, {opts.steps} steps of "
        f"{opts.tokens} tokens, checkpoint every {opts.ckpt_every or '-'}{' (async)' if opts.async_ckpt else ''}; "
        f"{len(opts.assignments)} storage assignment(s) x {len(opts.profiles)} profile(s); record {path}",
        flush=True,
    )
    for note in opts.notes:
        print(f"# note: {note}")
    with launch.partial_unless_finished(path), contextlib.ExitStack() as stack:
        tiers, env, helpers = _tiers(stack, tiers_used, opts)
        if lab is not None and tiers.ports:
            from ...lab.relay import LoopbackRelay

            hosts = [h.netns for h in lab.hosts[:nproc]]
            stack.enter_context(LoopbackRelay(hosts, tiers.ports))
        job_choice = dataclasses.replace(choice, env={**choice.env, **env})
        base = JobSpec(
            device=choice.device,
            backend=choice.backend,
            record=str(path),
            timeout_s=opts.timeout_s,
            nproc=nproc,
            shape=opts.shape,
            tokens=opts.tokens,
            steps=opts.steps,
            ckpt_every=opts.ckpt_every,
            async_ckpt=opts.async_ckpt,
            batch_size=opts.batch_size,
            sample_bytes=opts.sample_bytes,
            workers=opts.workers,
            tiers=tiers,
            assignments=list(opts.assignments),
            calibration=cal,
            cal_reps=opts.cal_reps,
            calibration_source=f"--calibration {opts.calibration}" if opts.calibration else None,
        )
        try:
            for label, rate in opts.profiles:
                if lab is not None:
                    labmod.shape(lab.name, rate, lab.delay_ms)
                code = launch.launch(
                    dataclasses.replace(base, profile=label), job_choice, lab=opts.lab, helpers=helpers
                )
                if code != 0:
                    return launch.left_partial(path, code)
        finally:
            if lab is not None:
                labmod.shape(lab.name, lab.rate_bps, lab.delay_ms)
    return _finish(path, opts.tolerance_pct)


def _tiers(
    stack: contextlib.ExitStack, used: list[str], opts: JobOptions
) -> tuple[JobTiers, dict[str, str], list[int | None]]:
    """Start what the assignments need, and the pids of the servers started (their CPU time is the
    run's, not other processes'); every piece is undone when the stack closes."""
    env: dict[str, str] = {}
    helpers: list[int | None] = []
    base = opts.base_dir or tempfile.gettempdir()
    directory = tempfile.mkdtemp(prefix="microbench-verify-job-", dir=base)
    stack.callback(shutil.rmtree, directory, True)
    tiers = JobTiers(dir=directory)
    if "s3" in used:
        from ...run.provision import embedded_s3_env
        from ...targets.s3server import EmbeddedS3

        server = stack.enter_context(EmbeddedS3(bucket=S3_BUCKET))
        assert server.port is not None  # known once it has started
        env.update(embedded_s3_env(server))
        tiers = dataclasses.replace(
            tiers, s3={"bucket": S3_BUCKET, "prefix": S3_PREFIX}, ports=[*tiers.ports, server.port]
        )
        helpers.append(server.pid)
    if "mount" in used:
        from ...targets import mount as mountmod

        name = f"vjob-{uuid.uuid4().hex[:8]}"
        # The mount's own state, cache and embedded server go away with it, whatever ends the run.
        stack.callback(mountmod.down, name)
        state, _ = mountmod.up(
            mountmod.MountRequest(name=name, mode="cached", write_back_s=opts.write_back_s, timeout_s=30)
        )
        # Rank 0 polls the mount's own server for durability: on a lab host it needs the relay too.
        tiers = dataclasses.replace(
            tiers, mount=state.path, mount_name=name, ports=[*tiers.ports, int(state.endpoint.rsplit(":", 1)[1])]
        )
        helpers += [state.rclone_pid, state.server_pid]
    return tiers, env, helpers


def run_phase(path: str) -> NoReturn:
    """A rank's side: one link profile's world."""
    from .world import run_profile

    def body(world: World, spec: RankSpec) -> int:
        assert isinstance(spec, JobSpec)
        return run_profile(world, spec)

    launch.run_rank(path, body)


def _finish(path: Path, tol: float) -> int:
    writer = RecordWriter.resume(path)  # as the profiles' rank 0 left it

    def judge(record: dict[str, Any]) -> None:
        judged = verdict(record["rows"], tol, record["summary"].get("load_by_phase"))
        record["summary"]["verdict"] = judged
        attach(record, judged)

    writer.update(judge)
    writer.finish("complete")
    record = writer.record
    print_report(record)
    print(f"# results: {path}")
    return noise.exit_for(record["summary"]["verdict"], path)
