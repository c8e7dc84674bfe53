"""`verify job` from the launching process: the record, the tiers (a directory, the embedded S3
server, a cached rclone mount of a bucket on its own embedded server), one world per link profile
(reshaping the lab in between), the verdict. Whatever it started it stops and removes, on failure
and interruption too."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

from .. import model as fm
from .plan import MATRIX_PROFILES, JobOptions
from .report import print_report, verdict
from ..fsdp.phases import left_partial, partial_unless_finished
from ..fsdp.plan import calibration_from, check_memory
from ...core.errors import RunError
from ...core.units import parse_positive_int
from ...lab import namespaces as labmod
from ...lab import placement as labrun
from ...results import RecordWriter, new_record
from ...results.store import atomic_write_text
from ...targets import native
from ...world import backends, environment as envmod
from ...world.launch import check_local_world, detect_world
from ...world.policy import in_world, local_ranks

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
    return dataclasses.replace(opts, lab=name, nproc=opts.nproc or "2", profiles=profiles,
                               notes=[*opts.notes, f"the link profiles run on lab {name} (2 hosts), made and "
                                                   f"removed by this run"])


def _run(opts: JobOptions, choice: Any) -> int:
    lab = labmod.get(opts.lab) if opts.lab else None
    given = parse_positive_int(opts.nproc, what="--nproc", example="2") if opts.nproc else None
    nproc = labrun.place(lab.name, nproc=given).nproc if lab is not None else (given or local_ranks())
    if lab is None and detect_world() is None:
        check_local_world(nproc)
    check_memory({"job": opts.shape}, [opts.tokens], nproc, choice)
    shape = fm.shape_from_args(**opts.shape)
    cal = calibration_from(opts.calibration, choice.backend, choice.device) if opts.calibration else None
    tiers_used = sorted({t for a in opts.assignments for t in a.tiers()})
    config = {"model": shape.describe(), "tokens": opts.tokens, "steps": opts.steps, "ckpt_every": opts.ckpt_every,
              "async_ckpt": opts.async_ckpt, "assignments": [a.label for a in opts.assignments],
              "tiers": tiers_used, "profiles": [p for p, _ in opts.profiles], "lab": opts.lab, "ranks": nproc,
              "batch_size": opts.batch_size, "sample_bytes": opts.sample_bytes, "workers": opts.workers,
              "write_back_s": opts.write_back_s, "tolerance_pct": opts.tolerance_pct, "matrix": opts.matrix,
              "calibration": opts.calibration, "cal_reps": opts.cal_reps, "backend": choice.backend,
              "device": choice.device, "notes": opts.notes}
    record = new_record("verify", config, envmod.collect(),
                        {**native.implementation(), "engine": "a short FSDP2 training job (safetensors load, "
                         "DataLoader over WebDataset shards, DCP checkpoints) vs compose/job.timeline",
                         "model": fm.FAMILY, "backend": choice.backend, "device": choice.device})
    writer = RecordWriter(record, opts.json, opts.results_dir)
    path = writer.path
    print(f"# verify job: {nproc} ranks ({choice.backend}/{choice.device}), {shape.name}, {opts.steps} steps of "
          f"{opts.tokens} tokens, checkpoint every {opts.ckpt_every or '-'}{' (async)' if opts.async_ckpt else ''}; "
          f"{len(opts.assignments)} storage assignment(s) x {len(opts.profiles)} profile(s); record {path}", flush=True)
    for note in opts.notes:
        print(f"# note: {note}")
    with partial_unless_finished(path), contextlib.ExitStack() as stack:
        tiers, env = _tiers(stack, tiers_used, opts)
        if lab is not None and tiers.get("ports"):
            from ...lab.relay import LoopbackRelay

            hosts = [h.netns for h in lab.hosts[:nproc]]
            stack.enter_context(LoopbackRelay(hosts, tiers["ports"]))
        job_choice = dataclasses.replace(choice, env={**choice.env, **env})
        base = {"device": choice.device, "backend": choice.backend, "record": str(path), "timeout": opts.timeout_s,
                "nproc": nproc, "shape": opts.shape, "tokens": opts.tokens, "steps": opts.steps,
                "ckpt_every": opts.ckpt_every, "async_ckpt": opts.async_ckpt, "batch_size": opts.batch_size,
                "sample_bytes": opts.sample_bytes, "workers": opts.workers, "tiers": tiers,
                "assignments": [(a.data, a.model_from, a.ckpt_to) for a in opts.assignments],
                "calibration": cal, "cal_reps": opts.cal_reps,
                "calibration_source": f"--calibration {opts.calibration}" if opts.calibration else None}
        try:
            for label, rate in opts.profiles:
                if lab is not None:
                    labmod.shape(lab.name, rate, lab.delay_ms)
                code = _launch({**base, "profile": label}, nproc, opts.timeout_s, job_choice, opts.lab)
                if code != 0:
                    return left_partial(path, code)
        finally:
            if lab is not None:
                labmod.shape(lab.name, lab.rate_bps, lab.delay_ms)
    return _finish(path, opts.tolerance_pct)


def _tiers(stack: contextlib.ExitStack, used: list[str], opts: JobOptions) -> tuple[dict[str, Any], dict[str, str]]:
    """Start what the assignments need; every piece is undone when the stack closes."""
    tiers: dict[str, Any] = {}
    env: dict[str, str] = {}
    base = opts.base_dir or tempfile.gettempdir()
    directory = tempfile.mkdtemp(prefix="microbench-verify-job-", dir=base)
    stack.callback(shutil.rmtree, directory, True)
    tiers["dir"] = directory
    if "s3" in used:
        from ...run.provision import embedded_s3_env
        from ...targets.s3server import EmbeddedS3

        server = stack.enter_context(EmbeddedS3(bucket=S3_BUCKET))
        env.update(embedded_s3_env(server))
        tiers["s3"] = {"bucket": S3_BUCKET, "prefix": S3_PREFIX}
        tiers.setdefault("ports", []).append(server.port)
    if "mount" in used:
        from ...targets import mount as mountmod

        name = f"vjob-{uuid.uuid4().hex[:8]}"
        # The mount's own state, cache and embedded server go away with it, whatever ends the run.
        stack.callback(mountmod.down, name)
        state, _ = mountmod.up(mountmod.MountRequest(name=name, mode="cached", write_back_s=opts.write_back_s,
                                                     timeout_s=30))
        tiers["mount"] = state.path
        tiers["mount_name"] = name
        # Rank 0 polls the mount's own server for durability: on a lab host it needs the relay too.
        tiers.setdefault("ports", []).append(int(state.endpoint.rsplit(":", 1)[1]))
    return tiers, env


def _launch(spec: dict[str, Any], nproc: int, timeout_s: float, choice: Any, lab_name: str | None) -> int:
    fd, spec_path = tempfile.mkstemp(suffix=".json", prefix="microbench-verify-job-")
    os.close(fd)
    try:
        atomic_write_text(Path(spec_path), json.dumps(spec, default=str), mode=0o600)
        per_rank, master = None, "127.0.0.1"
        if lab_name:
            placed = labrun.place(lab_name, nproc=nproc)
            master, per_rank = placed.master_addr, placed.per_rank
        return in_world(nproc=nproc, timeout_s=timeout_s, choice=choice, body=lambda w: 0, per_rank=per_rank,
                        master_addr=master, argv=["verify", "job", "--phase-spec", spec_path])
    finally:
        os.unlink(spec_path)


def run_phase(path: str) -> int:
    """A rank's side: one link profile's world, then leave without interpreter teardown (as verify
    fsdp's ranks do: gloo's threads can abort a finished rank at teardown)."""
    from .world import run_profile

    with open(path) as handle:
        spec = json.load(handle)
    choice = backends.choose(spec["backend"])
    code = in_world(nproc=spec["nproc"], timeout_s=spec["timeout"], choice=choice,
                    body=lambda world: run_profile(world, spec))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _finish(path: Any, tol: float) -> int:
    from ..fsdp.phases import RecordFile

    record_file = RecordFile(path)
    record_file.update(lambda r: r["summary"].__setitem__("verdict", verdict(r["rows"], tol)))
    record = record_file.finish("complete")
    print_report(record)
    print(f"# results: {path}")
    outside = record["summary"]["verdict"]["outside"]
    if outside:
        raise RunError(f"{len(outside)} configuration(s) outside the tolerance: {'; '.join(outside)} "
                       f"(every row is in {path})")
    return 0
