"""`microbench verify fsdp`: real FSDP2 transformer steps and DCP checkpoints, predicted by the
composer from probes run in the same invocation, with the error and a verdict."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
import tempfile
from typing import Any

from ..world import backends, environment as envmod
from ..verify import model as fm
from ..lab import namespaces as labmod
from ..targets import native
from ..world.dist import check_local_world, detect_world
from ..core.errors import RunError, UsageError
from ..results import RecordWriter, load_record, new_record
from ..world.policy import free_memory_bytes, gpu_free_bytes_without_context, in_world, local_ranks
from ..core.units import element_size, format_link_rate, parse_link_rate, parse_list, parse_number, parse_positive_int
from ..lab import placement as labrun
from .common import parse_timeout
from ..verify.report import print_report, verdict
from ..verify.checkpoint import check_ckpt_dir
from ..verify.phases import left_partial, partial_unless_finished

DEFAULT_MODELS, DEFAULT_TOKENS = "small,medium", "256,512"


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("verify", help="real FSDP2 steps and checkpoints vs the composer's prediction, with a verdict")
    vs = p.add_subparsers(dest="what", metavar="WHAT")
    vs.required = True
    f = vs.add_parser("fsdp", help="fully_shard a transformer, time real steps and DCP checkpoints, compare with "
                                   "the prediction from probes run in the same invocation",
                      description="Every input of the prediction is measured by a probe in this invocation "
                                  "(compute at the block's shapes, collectives at the unit sizes, AdamW at the "
                                  "shard size, the checkpoint probe on the target), plus a calibration on a "
                                  "configuration of its own (overlap, FSDP's per-unit cost, compute efficiency). "
                                  "Exit 1 when a configuration's error is outside the tolerance.")
    f.add_argument("--model", default=None, help=f"a verify preset ({', '.join(fm.PRESETS)}) or a composer preset "
                   f"(default small; with --matrix: {DEFAULT_MODELS})")
    f.add_argument("--models", default=None, help=f"with --matrix: comma-separated models (default {DEFAULT_MODELS})")
    f.add_argument("--hidden", default=None, help="hidden size instead of a preset (heads of 64, kv heads half, "
                   "ffn 8/3 h, like the presets)")
    f.add_argument("--layers", default=None, help="transformer blocks (FSDP units besides the root)")
    f.add_argument("--heads", default=None, help="attention heads (default hidden / 64)")
    f.add_argument("--vocab", default=None, help="vocabulary size (default 4096)")
    f.add_argument("--tokens", default=None, help=f"tokens per rank per step, comma-separated for several "
                   f"(default 256; with --matrix: {DEFAULT_TOKENS})")
    f.add_argument("--matrix", action="store_true", help="the held-out grid: models x token counts x link profiles, "
                   "plus the checkpoint to a directory and to S3")
    f.add_argument("--steps", default="6", help="timed steps per configuration (default 6)")
    f.add_argument("--warmup", default="2", help="untimed steps first (default 2)")
    f.add_argument("--lab", default=None, metavar="NAME", help="place one rank per host of this lab")
    f.add_argument("--link-profiles", default=None, metavar="RATES", help="with --lab: run every configuration under "
                   "each egress rate, e.g. unlimited,1gbit")
    f.add_argument("--calibration", default=None, metavar="RECORD", help="use this `verify fsdp --calibrate-only` "
                   "record instead of calibrating now (same backend and model family)")
    f.add_argument("--calibrate-only", action="store_true", help="only calibrate; write the record `compose "
                   "--calibration` reads (with --json PATH)")
    f.add_argument("--tolerance", default="10", help="largest |error| in percent for a step (default 10)")
    f.add_argument("--ckpt-tolerance", default="15", help="largest |error| in percent for checkpoint save and "
                   "load (default 15)")
    f.add_argument("--checkpoint", action=argparse.BooleanOptionalAction, default=None,
                   help="verify DCP save/load to a directory and the embedded S3 (default: on with --matrix)")
    f.add_argument("--ckpt-dir", default=None, help="directory target for the checkpoint (default: a temporary "
                   "directory, removed afterwards)")
    f.add_argument("--ckpt-reps", default="5", help="timed saves and loads per target, each beside a probe save "
                   "and load (default 5)")
    f.add_argument("--nproc", default=None, help="local ranks when not launched (default: GPUs, else 2; the lab's hosts)")
    f.add_argument("--backend", default="auto", help="auto, nccl or gloo")
    f.add_argument("--timeout", default="120", help="seconds before a silent peer fails the run")
    f.add_argument("--json", default=None, metavar="PATH")
    f.add_argument("--results-dir", default="results")
    f.add_argument("--phase-spec", default=None, help=argparse.SUPPRESS)
    f.set_defaults(handler=run_fsdp)


# --------------------------------------------------------------------------- validation

def _ints(text: str, what: str, example: str) -> list[int]:
    return [parse_positive_int(t, what=what, example=example) for t in str(text).split(",") if t.strip()]


def shapes(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """name -> the keyword arguments that rebuild the shape on every rank."""
    explicit = {k: parse_positive_int(getattr(args, k), what=f"--{k}", example=ex)
                for k, ex in (("hidden", "512"), ("layers", "4"), ("heads", "8"), ("vocab", "4096"))
                if getattr(args, k) is not None}
    if explicit:
        if args.model or args.models:
            raise UsageError("--model/--models and --hidden/--layers/--heads/--vocab describe the model twice; give one")
        kwargs = {"model": None, "hidden": None, "layers": None, "heads": None, "vocab": None, **explicit}
        shape = fm.shape_from_args(**kwargs)
        return {shape.name: kwargs}
    names = args.models or args.model or (DEFAULT_MODELS if args.matrix else "small")
    out = {}
    for name in [n.strip() for n in names.split(",") if n.strip()]:
        kwargs = {"model": name, "hidden": None, "layers": None, "heads": None, "vocab": None}
        shape = fm.shape_from_args(**kwargs)
        fm.check_buildable(shape)
        out[shape.name] = kwargs
    return out


def tolerance(text: str, what: str) -> float:
    return parse_number(text, what=what, example="10", minimum=0, allow_minimum=False, maximum=1000)


def profiles(args: argparse.Namespace) -> list[tuple[str, int | None]]:
    if args.link_profiles is None:
        return [("unlimited" if args.lab else "loopback", None)]
    labels = [p.strip() for p in str(args.link_profiles).split(",") if p.strip()]
    if not labels:
        raise UsageError(f"invalid --link-profiles {args.link_profiles!r}: expected rates, e.g. unlimited,1gbit")
    out = []
    for label in labels:
        try:
            out.append((format_link_rate(parse_link_rate(label)), parse_link_rate(label)))
        except UsageError:
            raise UsageError(f"unknown link profile {label!r} in --link-profiles: expected unlimited or a rate in "
                             f"bit/kbit/mbit/gbit, e.g. --link-profiles unlimited,1gbit") from None
    if not args.lab:
        raise UsageError("--link-profiles needs --lab NAME: it reshapes the lab's links between profiles, "
                         "e.g. --lab v --link-profiles unlimited,1gbit")
    return out


def calibration_from(path: str, backend: str, device: str) -> dict[str, Any]:
    record = load_record(path)
    cal = (record.get("summary") or {}).get("calibration") if isinstance(record.get("summary"), dict) else None
    if not isinstance(cal, dict) or not isinstance(cal.get("overlap"), (int, float)):
        raise UsageError(f"--calibration {path!r} is a {record.get('kind')!r} record without summary.calibration; "
                         f"expected one from `microbench verify fsdp --calibrate-only --json cal.json`")
    if cal.get("backend") != backend or cal.get("device", device) != device:
        raise UsageError(f"--calibration {path!r} was measured with {cal.get('backend')} on {cal.get('device')}; "
                         f"this run uses {backend} on {device}: calibrate here, e.g. `microbench verify fsdp "
                         f"--calibrate-only --json cal.json`")
    family = (cal.get("model") or {}).get("family") if isinstance(cal.get("model"), dict) else None
    if family != fm.FAMILY:
        raise UsageError(f"--calibration {path!r} was measured on another model ({family or 'unnamed'}); "
                         f"verify builds a {fm.FAMILY}: calibrate it, e.g. `microbench verify fsdp "
                         f"--calibrate-only --json cal.json`")
    for key, hi in (("overlap", 1.0), ("unit_overhead_s", 1.0), ("compute_efficiency", 10.0)):
        if cal.get(key) is not None:
            parse_number(cal[key], what=f"--calibration {key}", example="0.5", minimum=0, maximum=hi)
    return cal


def memory_need_bytes(shape: Any, tokens: int, ranks: int, precision: fm.Precision) -> float:
    """Per rank: the composer's FSDP memory check plus the unsharded copy the compute-alone
    comparison trains beside it. The composer's activation estimate counts bf16 elements
    (compose.fsdp.activation_bytes): scaled by this run's element size over bf16's, it stays as
    it is for bf16 on a GPU and doubles for fp32 on the CPU."""
    from ..compose.fsdp import TrainSpec, memory_check

    train = TrainSpec(ranks=ranks, micro_batch=1, seq_len=tokens, flops_per_rank=1.0,
                      param_dtype=precision.param_dtype, reduce_dtype=precision.reduce_dtype)
    check = memory_check(shape, train, None)
    scale = precision.bytes / element_size("bfloat16")
    replica = shape.total_params * (precision.bytes * 2) + (check.activation_bytes or 0) * scale
    return check.sharded_state_bytes + check.gathered_bytes + (check.activation_bytes or 0) * scale + replica


def check_memory(shape_kwargs: dict[str, dict[str, Any]], tokens: list[int], ranks: int, choice: Any) -> None:
    precision = fm.precision_for(choice.device)
    here = ranks if choice.device == "cpu" else 1
    if choice.device == "cuda":
        # Each rank has its own GPU: the one with the least free memory decides, read without
        # a CUDA context in this launcher; when NVML cannot say, the ranks' own start-up decides.
        frees = gpu_free_bytes_without_context(ranks)
        if not frees:
            return
        free = min(frees)
    else:
        free = free_memory_bytes(choice.device)
    where = "GPU memory" if choice.device == "cuda" else "host memory"
    for kwargs in shape_kwargs.values():
        shape = fm.shape_from_args(**kwargs)
        need = memory_need_bytes(shape, max(tokens), ranks, precision) * here
        if need > free * 0.8:
            raise UsageError(f"model {shape.name!r} ({shape.total_params / 1e9:.2f} B parameters) needs about "
                             f"{need / 2**30:.1f} GiB of {where} for {ranks} rank(s) at {max(tokens)} tokens, but "
                             f"{free / 2**30:.1f} GiB is free; use a smaller model, e.g. --model small")


# --------------------------------------------------------------------------- the launcher

def run_fsdp(args: argparse.Namespace) -> int:
    if args.phase_spec:
        return _run_phase(args.phase_spec)
    if detect_world() is not None:
        raise UsageError("verify fsdp launches its own ranks (a world per link profile); run it without "
                         "torchrun/srun/mpirun")
    shape_kwargs = shapes(args)
    tokens = _ints(args.tokens or (DEFAULT_TOKENS if args.matrix else "256"), "--tokens", "256")
    steps = parse_positive_int(args.steps, what="--steps", example="5")
    warmup = parse_number(args.warmup, what="--warmup", example="2", minimum=0, maximum=100)
    tol = tolerance(args.tolerance, "--tolerance")
    ckpt_tol = tolerance(args.ckpt_tolerance, "--ckpt-tolerance")
    ckpt_reps = parse_positive_int(args.ckpt_reps, what="--ckpt-reps", example="3")
    timeout_s = parse_timeout(args.timeout)
    profs = profiles(args)
    choice = backends.choose(args.backend)
    lab = labmod.get(args.lab) if args.lab else None
    if lab is not None:
        nproc = labrun.place(args.lab, nproc=parse_positive_int(args.nproc, what="--nproc", example="2")
                             if args.nproc else None).nproc
    else:
        nproc = parse_positive_int(args.nproc, what="--nproc", example="2") if args.nproc else local_ranks()
    cal = calibration_from(args.calibration, choice.backend, choice.device) if args.calibration else None
    if args.calibrate_only and cal is not None:
        raise UsageError("--calibrate-only measures a calibration; it takes no --calibration")
    if lab is None and detect_world() is None:
        check_local_world(nproc)  # before the memory check, which scales with nproc
    check_memory(shape_kwargs, tokens, nproc, choice)
    checkpoint = (args.matrix if args.checkpoint is None else args.checkpoint) and not args.calibrate_only
    if checkpoint and args.ckpt_dir:
        check_ckpt_dir(args.ckpt_dir)
    configs = [(name, t) for name in shape_kwargs for t in tokens]
    config = {"models": {n: fm.shape_from_args(**k).describe() for n, k in shape_kwargs.items()}, "tokens": tokens,
              "profiles": [p for p, _ in profs], "lab": args.lab, "ranks": nproc, "steps": steps, "warmup": int(warmup),
              "tolerance_pct": tol, "ckpt_tolerance_pct": ckpt_tol, "checkpoint": checkpoint,
              "calibration": args.calibration, "backend": choice.backend, "device": choice.device,
              "precision": dataclasses.asdict(fm.precision_for(choice.device))}
    kind = "calibration" if args.calibrate_only else "verify"   # the kinds `compose --calibration` takes
    record = new_record(kind, config, envmod.collect(),
                        {**native.implementation(), "engine": "torch fully_shard (FSDP2) + torch.distributed.checkpoint",
                         "model": fm.FAMILY, "backend": choice.backend, "device": choice.device})
    writer = RecordWriter(record, args.json, args.results_dir)
    path = writer.path
    base = {"device": choice.device, "backend": choice.backend, "record": str(path), "timeout": timeout_s,
            "nproc": nproc, "shapes": shape_kwargs, "configs": configs, "steps": steps, "warmup": int(warmup),
            "calibrate_only": args.calibrate_only, "calibration": cal,
            "calibration_source": f"--calibration {args.calibration}" if args.calibration else None}
    print(f"# verify fsdp: {nproc} ranks ({choice.backend}/{choice.device}), "
          f"{'calibration only' if args.calibrate_only else f'{len(configs)} configuration(s) x {len(profs)} profile(s)'}"
          f"{', checkpoint to a directory and S3' if checkpoint else ''}; record {path}", flush=True)
    # A signal or a failed phase must not leave the record "running" (issue 20).
    with partial_unless_finished(path):
        try:
            for label, rate in profs:
                if lab is not None:
                    labmod.shape(lab.name, rate, lab.delay_ms)
                spec = {**base, "phase": "steps", "profile": label}
                if cal is not None and label in (cal.get("profiles") or {}):
                    spec["calibration"] = {**cal, **cal["profiles"][label]}   # measured under this very profile
                code = _launch(spec, nproc, timeout_s, choice, args.lab)
                if code != 0:
                    return left_partial(path, code)
            if checkpoint:
                code = _checkpoint_phase(args, base, shape_kwargs, nproc, timeout_s, choice, ckpt_reps)
                if code != 0:
                    return left_partial(path, code)
        finally:
            if lab is not None:
                labmod.shape(lab.name, lab.rate_bps, lab.delay_ms)
    return _finish(path, tol, ckpt_tol, args.calibrate_only, cal)


def _launch(spec: dict[str, Any], nproc: int, timeout_s: float, choice: Any, lab_name: str | None) -> int:
    with tempfile.NamedTemporaryFile("w", suffix=".json", prefix="microbench-verify-", delete=False) as handle:
        json.dump(spec, handle, default=str)
    try:
        per_rank, master = None, "127.0.0.1"
        if lab_name and spec["phase"] == "steps":
            placed = labrun.place(lab_name, nproc=nproc)
            master, per_rank = placed.master_addr, placed.per_rank
        return in_world(nproc=nproc, timeout_s=timeout_s, choice=choice, body=lambda w: 0, per_rank=per_rank,
                        master_addr=master, argv=["verify", "fsdp", "--phase-spec", handle.name])
    finally:
        os.unlink(handle.name)


def _checkpoint_phase(args: argparse.Namespace, base: dict[str, Any], shape_kwargs: dict[str, Any], nproc: int,
                      timeout_s: float, choice: Any, reps: int) -> int:
    """On loopback (the storage path, not the lab's links): the largest model of the run."""
    from ..targets import checkpoint_target as ct
    from ..targets.s3server import EmbeddedS3
    from ..run.provision import ENV_ENDPOINT, ENV_KEY, ENV_ROOT, ENV_SECRET

    largest = max(shape_kwargs, key=lambda n: fm.shape_from_args(**shape_kwargs[n]).total_params)
    with contextlib.ExitStack() as stack:
        directory = args.ckpt_dir or stack.enter_context(tempfile.TemporaryDirectory(prefix="microbench-verify-ckpt-"))
        ct.preflight_local(ct.parse_target(directory), 64 << 20)
        server = stack.enter_context(EmbeddedS3(bucket="microbench"))
        env = {ENV_ENDPOINT: server.endpoint_url, ENV_KEY: server.credentials.access_key_id,
               ENV_SECRET: server.credentials.secret_access_key, ENV_ROOT: str(server.root)}
        spec = {**base, "phase": "checkpoint", "shape": shape_kwargs[largest], "reps": reps,
                "targets": [("directory", directory), ("s3", "s3://microbench/verify")]}
        return _launch(spec, nproc, timeout_s, dataclasses.replace(choice, env={**choice.env, **env}), None)


def _run_phase(path: str) -> int:
    with open(path) as handle:
        spec = json.load(handle)
    choice = backends.choose(spec["backend"])
    if spec["phase"] == "checkpoint":
        from ..verify.checkpoint import run_checkpoints

        body = lambda world: run_checkpoints(world, spec)  # noqa: E731
    else:
        from ..verify.phases import run_steps

        body = lambda world: run_steps(world, spec)  # noqa: E731
    code = in_world(nproc=spec["nproc"], timeout_s=spec["timeout"], choice=choice, body=body)
    # A rank is done once its world is closed; the interpreter's teardown of gloo's threads can
    # still abort ("terminate called without an active exception") and turn a finished phase
    # into a failed rank, so a rank that finished leaves without it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _finish(path: Any, tol: float, ckpt_tol: float, calibrate_only: bool, given: dict[str, Any] | None) -> int:
    from ..verify.phases import RecordFile

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
