"""`microbench verify fsdp`: real FSDP2 transformer steps and DCP checkpoints, predicted by the
composer from probes run in the same invocation, with the error and a verdict.

The command parses its flags into verify.plan.VerifyOptions; verify.run launches the phases."""

from __future__ import annotations

import argparse

from ..core.units import parse_number, parse_positive_int
from ..verify import launch
from ..verify import model as fm
from ..verify.fsdp import plan
from ..verify.job import plan as jplan
from ..verify.fsdp import run as vrun
from ..verify.fsdp.plan import DEFAULT_MODELS, DEFAULT_TOKENS
from .common import parse_timeout
from ..compose.checkpoint.full import parse_state_dicts


# verify fsdp and verify job calibrate the same way: one help text for both.
CAL_REPS_HELP = ("timed steps (or pairs) behind each calibration number: 15 for FSDP's per-unit cost and 9 for the "
                 "overlap and the compute efficiency unless given; fewer is quicker and noisier (at least 3)")


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
    f.add_argument("--lab", default=None, metavar="NAME", help="place the lab's ranks per host on each host of this lab")
    f.add_argument("--sharding", default="full", help="full (fully_shard over the world), hybrid (HSDP: a 2-D mesh, "
                   "sharded within a node, replicated across nodes) or full,hybrid (default full)")
    f.add_argument("--link-profiles", default=None, metavar="RATES", help="with --lab: run every configuration under "
                   "each egress rate, e.g. unlimited,1gbit")
    f.add_argument("--calibration", default=None, metavar="RECORD", help="use this `verify fsdp --calibrate-only` "
                   "record instead of calibrating now (same backend and model family)")
    f.add_argument("--cal-reps", default=None, metavar="N", help=CAL_REPS_HELP)
    f.add_argument("--calibrate-only", action="store_true", help="only calibrate; write the record `compose "
                   "--calibration` reads (with --json PATH)")
    f.add_argument("--tolerance", default="10", help="largest |error| in percent for a step (default 10)")
    f.add_argument("--ckpt-tolerance", default="15", help="largest |error| in percent for checkpoint save and "
                   "load (default 15)")
    f.add_argument("--checkpoint", action=argparse.BooleanOptionalAction, default=None,
                   help="verify DCP save/load to a directory and the embedded S3 (default: on with --matrix)")
    f.add_argument("--ckpt-dir", default=None, help="directory target for the checkpoint (default: a temporary "
                   "directory, removed afterwards)")
    f.add_argument("--state-dict", default="sharded", help="with --checkpoint: sharded (DCP), full (gathered to rank "
                   "0, torch.save) or full,sharded (default sharded)")
    f.add_argument("--ckpt-reps", default="9", help="timed saves and loads per target, each beside a probe save "
                   "and load; rows are medians, and a small checkpoint's cold reads are noisy (default 9)")
    f.add_argument("--nproc", default=None, help="local ranks when not launched (default: GPUs, else 2; the lab's hosts)")
    f.add_argument("--backend", default="auto", help="auto, nccl or gloo")
    f.add_argument("--timeout", default="120", help="seconds before a silent peer fails the run")
    f.add_argument("--json", default=None, metavar="PATH")
    f.add_argument("--results-dir", default="results")
    f.add_argument("--phase-spec", default=None, help=argparse.SUPPRESS)
    f.set_defaults(handler=run_fsdp)
    add_job_parser(vs)


def options(args: argparse.Namespace) -> plan.VerifyOptions:
    shape_kwargs = plan.shapes(args.model, args.models, {k: getattr(args, k) for k in ("hidden", "layers", "heads", "vocab")},
                               args.matrix)
    tokens = plan.ints(args.tokens or (DEFAULT_TOKENS if args.matrix else "256"), "--tokens", "256")
    steps = parse_positive_int(args.steps, what="--steps", example="5")
    warmup = parse_number(args.warmup, what="--warmup", example="2", minimum=0, maximum=100)
    tol = plan.tolerance(args.tolerance, "--tolerance")
    ckpt_tol = plan.tolerance(args.ckpt_tolerance, "--ckpt-tolerance")
    ckpt_reps = parse_positive_int(args.ckpt_reps, what="--ckpt-reps", example="3")
    state_dicts = parse_state_dicts(args.state_dict)   # refused before any rank starts
    timeout_s = parse_timeout(args.timeout)
    profiles = plan.profiles(args.link_profiles, args.lab)
    checkpoint = (args.matrix if args.checkpoint is None else args.checkpoint) and not args.calibrate_only
    sharding = plan.shardings(args.sharding)
    reps = plan.cal_reps(args.cal_reps)
    return plan.VerifyOptions(shapes=shape_kwargs, tokens=tokens, steps=steps, warmup=int(warmup), tolerance_pct=tol,
                              ckpt_tolerance_pct=ckpt_tol, ckpt_reps=ckpt_reps, timeout_s=timeout_s,
                              profiles=profiles, backend=args.backend, lab=args.lab, nproc=args.nproc,
                              calibration=args.calibration, calibrate_only=args.calibrate_only,
                              checkpoint=checkpoint, ckpt_dir=args.ckpt_dir, state_dicts=state_dicts, json=args.json,
                              results_dir=args.results_dir, shardings=sharding, cal_reps=reps)


def run_fsdp(args: argparse.Namespace) -> int:
    if args.phase_spec:
        vrun.run_phase(args.phase_spec)
    launch.refuse_in_world("verify fsdp")
    return vrun.run_fsdp(options(args))


# --------------------------------------------------------------------------- verify job (issue 23)

def add_job_parser(vs: argparse._SubParsersAction) -> None:
    j = vs.add_parser("job", help="a short real training job (model load, batches, steps, checkpoints) on chosen "
                                  "storage tiers vs the composer's job timeline from probes run in the same invocation",
                      description="Writes the model as modelload does and loads it, builds the FSDP2 model, streams "
                                  "batches with a DataLoader from a tier, trains --steps steps, saves a DCP checkpoint "
                                  "every --ckpt-every steps and a final one until durable; times every phase and the "
                                  "total, and compares them with compose's job timeline over costs from the "
                                  "modelload, dataload and checkpoint probes on the same tiers and verify fsdp's step "
                                  "prediction, all run in this invocation. Tiers: dir, s3 (the embedded server), "
                                  "mount (its bucket through a cached rclone mount). Exit 1 when a configuration's "
                                  "total is outside --tolerance.")
    j.add_argument("--model", default="small", help=f"a verify preset ({', '.join(fm.PRESETS)}) (default small)")
    j.add_argument("--tokens", default="256", help="tokens per rank per step (default 256)")
    j.add_argument("--steps", default="12", help="training steps (default 12)")
    j.add_argument("--ckpt-every", default="4", help="steps between checkpoints (default 4; the last step's is the "
                   "final save)")
    j.add_argument("--async-ckpt", action="store_true", help="checkpoint with dcp.async_save")
    j.add_argument("--data", default=None, metavar="TIER", help="where batches come from: dir, s3 or mount (default dir)")
    j.add_argument("--model-from", default=None, metavar="TIER", help="where the model is loaded from (default dir)")
    j.add_argument("--ckpt-to", default=None, metavar="TIER", help="where checkpoints go (default dir)")
    j.add_argument("--matrix", action="store_true", help="every assignment of the matrix (all dir; data and model "
                   "from s3 with checkpoints to a cached mount) x the link profiles unlimited,1gbit (on --lab, or a "
                   "two-host lab made and removed by the run)")
    j.add_argument("--batch-size", default="8", help="samples per step per rank (default 8)")
    j.add_argument("--sample-size", default="4K", help="bytes per sample (default 4K)")
    j.add_argument("--workers", default="1", help="DataLoader workers per rank (default 1)")
    j.add_argument("--write-back", default="1s", help="mount tier: rclone's write-back delay (default 1s)")
    j.add_argument("--dir", default=None, help="where the dir tier's files go (default: the temp dir)")
    j.add_argument("--lab", default=None, metavar="NAME", help="place one rank per host of this lab")
    j.add_argument("--link-profiles", default=None, metavar="RATES", help="with --lab: every configuration under "
                   "each egress rate, e.g. unlimited,200mbit")
    j.add_argument("--calibration", default=None, metavar="RECORD", help="a `verify fsdp --calibrate-only` record "
                   "instead of calibrating now")
    j.add_argument("--cal-reps", default=None, metavar="N", help=CAL_REPS_HELP)
    j.add_argument("--tolerance", default="15", help="largest |error| in percent of the total (default 15)")
    j.add_argument("--nproc", default=None, help="local ranks when not launched (default: GPUs, else 2)")
    j.add_argument("--backend", default="auto", help="auto, nccl or gloo")
    j.add_argument("--timeout", default="180", help="seconds before a silent peer fails the run")
    j.add_argument("--json", default=None, metavar="PATH")
    j.add_argument("--results-dir", default="results")
    j.add_argument("--phase-spec", default=None, help=argparse.SUPPRESS)
    j.set_defaults(handler=run_job)


def job_options(args: argparse.Namespace) -> "jplan.JobOptions":
    from ..core.units import parse_duration_s
    from ..targets.mount.system import fuse_unavailable_reason
    from ..targets.workdir import check_base

    shape = {"model": args.model, "hidden": None, "layers": None, "heads": None, "vocab": None}
    fm.check_buildable(fm.shape_from_args(**shape))
    tokens = parse_positive_int(args.tokens, what="--tokens", example="256")
    steps = jplan.steps(args.steps)
    every = jplan.ckpt_every(args.ckpt_every)
    batch = parse_positive_int(args.batch_size, what="--batch-size", example="8")
    sample = jplan.sample_bytes(args.sample_size)
    jplan.check_tokens_fit(tokens, batch, sample)
    matrix_needs_fuse = args.matrix or "mount" in {str(t).strip().lower() for t in (args.data, args.model_from,
                                                                                    args.ckpt_to) if t}
    fuse = fuse_unavailable_reason() if matrix_needs_fuse else None
    chosen, notes = jplan.assignments(args.data, args.model_from, args.ckpt_to, args.matrix, fuse)
    links = args.link_profiles or (jplan.MATRIX_PROFILES if args.matrix and args.lab else None)
    if args.dir is not None:
        check_base(args.dir)
    return jplan.JobOptions(
        shape=shape, tokens=tokens, steps=steps, ckpt_every=every, async_ckpt=args.async_ckpt, assignments=chosen,
        profiles=plan.profiles(links, args.lab), tolerance_pct=jplan.tolerance(args.tolerance), batch_size=batch,
        sample_bytes=sample, workers=jplan.workers(args.workers),
        write_back_s=parse_duration_s(args.write_back, what="--write-back", example="1s"),
        timeout_s=parse_timeout(args.timeout), backend=args.backend, lab=args.lab, matrix=args.matrix,
        nproc=args.nproc, calibration=args.calibration, cal_reps=plan.cal_reps(args.cal_reps), base_dir=args.dir,
        json=args.json, results_dir=args.results_dir, notes=notes)


def run_job(args: argparse.Namespace) -> int:
    from ..verify.job import run as job_run

    if args.phase_spec:
        job_run.run_phase(args.phase_spec)
    launch.refuse_in_world("verify job")
    return job_run.run_job(job_options(args))
