"""`verify fsdp` from the launching process: the record, one world per link profile (reshaping
the lab in between), the checkpoint world, the verdict; and what a rank does with its phase spec."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from .. import collector
from .. import model as fm
from .plan import VerifyOptions, calibration_from, check_hybrid, check_memory
from .phases import cal_key
from ..checkpoint.sharded import check_ckpt_dir
from .phases import left_partial, partial_unless_finished
from .report import print_report, verdict
from ...core.errors import RunError, UsageError
from ...core.units import parse_positive_int
from ...lab import namespaces as labmod
from ...lab import placement as labrun
from ...results import RecordWriter, new_record
from ...results.store import atomic_write_text
from ...targets import native
from ...world import backends, environment as envmod
from ...world.launch import RankLaunch, check_local_world, detect_world
from ...world.policy import in_world, local_ranks


def refuse_in_world() -> None:
    if detect_world() is not None:
        raise UsageError("verify fsdp launches its own ranks (a world per link profile); run it without "
                         "torchrun/srun/mpirun")


def run_fsdp(opts: VerifyOptions) -> int:
    """Launch every phase of a verify run; exit code (RunError when outside the tolerance)."""
    shape_kwargs, tokens, steps, warmup = opts.shapes, opts.tokens, opts.steps, opts.warmup
    tol, ckpt_tol, ckpt_reps, timeout_s, profs = (opts.tolerance_pct, opts.ckpt_tolerance_pct, opts.ckpt_reps,
                                                  opts.timeout_s, opts.profiles)
    choice = backends.choose(opts.backend)
    lab = labmod.get(opts.lab) if opts.lab else None
    given = parse_positive_int(opts.nproc, what="--nproc", example="2") if opts.nproc else None
    per_node = 1
    if lab is not None:
        nproc = labrun.place(lab.name, nproc=given).nproc
        per_node = lab.ranks_per_host
    else:
        nproc = given or local_ranks()
        per_node = nproc   # microbench's own local ranks: one node
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
    config = {"models": {n: fm.shape_from_args(**k).describe() for n, k in shape_kwargs.items()}, "tokens": tokens,
              "profiles": [p for p, _ in profs], "lab": opts.lab, "ranks": nproc, "shardings": opts.shardings,
              "ranks_per_node": per_node, "steps": steps, "warmup": int(warmup),
              "tolerance_pct": tol, "ckpt_tolerance_pct": ckpt_tol, "checkpoint": checkpoint,
              "calibration": opts.calibration, "cal_reps": opts.cal_reps, "backend": choice.backend,
              "device": choice.device, "precision": dataclasses.asdict(fm.precision_for(choice.device))}
    kind = "calibration" if opts.calibrate_only else "verify"   # the kinds `compose --calibration` takes
    record = new_record(kind, config, envmod.collect(),
                        {**native.implementation(), "engine": "torch fully_shard (FSDP2) + torch.distributed.checkpoint",
                         "model": fm.FAMILY, "backend": choice.backend, "device": choice.device,
                         "gc": collector.NOTE})
    writer = RecordWriter(record, opts.json, opts.results_dir)
    path = writer.path
    base = {"device": choice.device, "backend": choice.backend, "record": str(path), "timeout": timeout_s,
            "nproc": nproc, "shapes": shape_kwargs, "configs": configs, "steps": steps, "warmup": int(warmup),
            "calibrate_only": opts.calibrate_only, "calibration": cal, "cal_reps": opts.cal_reps,
            "calibration_source": f"--calibration {opts.calibration}" if opts.calibration else None}
    print(f"# verify fsdp: {nproc} ranks ({choice.backend}/{choice.device}), "
          f"{'calibration only' if opts.calibrate_only else f'{len(configs)} configuration(s) x {len(profs)} profile(s)'}"
          f"{f' x {len(opts.shardings)} shardings' if len(opts.shardings) > 1 else ''}"
          f"{', checkpoint to a directory and S3' if checkpoint else ''}; record {path}", flush=True)
    # A signal or a failed phase must not leave the record "running" (issue 20).
    with partial_unless_finished(path):
        try:
            for label, rate in profs:
                if lab is not None:
                    labmod.shape(lab.name, rate, lab.delay_ms)
                for sharding in opts.shardings:
                    spec = {**base, "phase": "steps", "profile": label, "sharding": sharding}
                    key = cal_key(label, sharding)
                    if cal is not None and key in (cal.get("profiles") or {}):
                        spec["calibration"] = {**cal, **cal["profiles"][key]}   # measured under this very profile
                    code = _launch(spec, nproc, timeout_s, choice, opts.lab)
                    if code != 0:
                        return left_partial(path, code)
            if checkpoint:
                code = _checkpoint_phase(opts.ckpt_dir, {**base, "shardings": opts.shardings}, shape_kwargs, nproc,
                                         timeout_s, choice, ckpt_reps, opts.state_dicts, per_node)
                if code != 0:
                    return left_partial(path, code)
        finally:
            if lab is not None:
                labmod.shape(lab.name, lab.rate_bps, lab.delay_ms)
    return _finish(path, tol, ckpt_tol, opts.calibrate_only, cal)


def _launch(spec: dict[str, Any], nproc: int, timeout_s: float, choice: Any, lab_name: str | None,
            per_node: int | None = None) -> int:
    fd, spec_path = tempfile.mkstemp(suffix=".json", prefix="microbench-verify-")
    os.close(fd)
    try:
        atomic_write_text(Path(spec_path), json.dumps(spec, default=str), mode=0o600)  # as mkstemp made it
        per_rank, master = None, "127.0.0.1"
        if lab_name and spec["phase"] == "steps":
            placed = labrun.place(lab_name, nproc=nproc)
            master, per_rank = placed.master_addr, placed.per_rank
        elif per_node:
            # On loopback, but with the lab's nodes (HSDP's mesh is built from them).
            per_rank = lambda rank: RankLaunch(env={"LOCAL_RANK": str(rank % per_node),  # noqa: E731
                                                    "LOCAL_WORLD_SIZE": str(per_node)})
        return in_world(nproc=nproc, timeout_s=timeout_s, choice=choice, body=lambda w: 0, per_rank=per_rank,
                        master_addr=master, argv=["verify", "fsdp", "--phase-spec", spec_path])
    finally:
        os.unlink(spec_path)


def _checkpoint_phase(ckpt_dir: str | None, base: dict[str, Any], shape_kwargs: dict[str, Any], nproc: int,
                      timeout_s: float, choice: Any, reps: int, state_dicts: list[str], per_node: int = 1) -> int:
    """On loopback (the storage path, not the lab's links): the largest model of the run."""
    from ...targets import checkpoint_target as ct
    from ...targets.s3server import EmbeddedS3
    from ...run.provision import ENV_ENDPOINT, ENV_KEY, ENV_ROOT, ENV_SECRET

    largest = max(shape_kwargs, key=lambda n: fm.shape_from_args(**shape_kwargs[n]).total_params)
    with contextlib.ExitStack() as stack:
        directory = ckpt_dir or stack.enter_context(tempfile.TemporaryDirectory(prefix="microbench-verify-ckpt-"))
        ct.preflight_local(ct.parse_target(directory), 64 << 20)
        server = stack.enter_context(EmbeddedS3(bucket="microbench"))
        env = {ENV_ENDPOINT: server.endpoint_url, ENV_KEY: server.credentials.access_key_id,
               ENV_SECRET: server.credentials.secret_access_key, ENV_ROOT: str(server.root)}
        spec = {**base, "phase": "checkpoint", "shape": shape_kwargs[largest], "reps": reps, "state_dicts": state_dicts,
                "targets": [("directory", directory), ("s3", "s3://microbench/verify")]}
        return _launch(spec, nproc, timeout_s, dataclasses.replace(choice, env={**choice.env, **env}), None,
                       per_node if "hybrid" in base["shardings"] else None)


def run_phase(path: str) -> int:
    """A rank's side: run the phase its spec file names, then leave without interpreter teardown."""
    with open(path) as handle:
        spec = json.load(handle)
    choice = backends.choose(spec["backend"])
    if spec["phase"] == "checkpoint":
        from ..checkpoint.sharded import run_checkpoints

        body = lambda world: run_checkpoints(world, spec)  # noqa: E731
    else:
        from .phases import run_steps

        body = lambda world: run_steps(world, spec)  # noqa: E731
    code = in_world(nproc=spec["nproc"], timeout_s=spec["timeout"], choice=choice, body=body)
    # A rank is done once its world is closed; the interpreter's teardown of gloo's threads can
    # still abort ("terminate called without an active exception") and turn a finished phase
    # into a failed rank, so a rank that finished leaves without it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _finish(path: Any, tol: float, ckpt_tol: float, calibrate_only: bool, given: dict[str, Any] | None) -> int:
    from .phases import RecordFile

    record_file = RecordFile(path)

    def summarize(record: dict[str, Any]) -> None:
        by_profile = record["summary"].get("calibration_by_profile") or {}
        if given is not None:
            record["summary"]["calibration"] = given   # what the predictions used, for compose too
        elif by_profile:
            first = next(iter(by_profile.values()))
            record["summary"]["calibration"] = {**first, "profiles": {k: {"overlap": v["overlap"],
                                                "unit_overhead_s": v["unit_overhead_s"],
                                                "compute_efficiency": v["compute_efficiency"]}
                                                for k, v in by_profile.items()}}
        if not calibrate_only:
            record["summary"]["verdict"] = verdict(record["rows"], tol, ckpt_tol)

    record = record_file.update(summarize)
    record = record_file.finish("complete")
    print_report(record, calibrate_only)
    print(f"# results: {path}")
    if calibrate_only:
        return 0
    outside = record["summary"]["verdict"]["outside"]
    if outside:
        raise RunError(f"{len(outside)} configuration(s) outside the tolerance: {'; '.join(outside)} "
                       f"(every row is in {path})")
    return 0
