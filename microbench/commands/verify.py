"""`microbench verify fsdp`: real FSDP2 transformer steps and DCP checkpoints, predicted by the
composer from probes run in the same invocation, with the error and a verdict.

The command parses its flags into verify.plan.VerifyOptions; verify.run launches the phases."""

from __future__ import annotations

import argparse

from ..core.units import parse_number, parse_positive_int
from ..verify import model as fm
from ..verify import plan
from ..verify import run as vrun
from ..verify.plan import DEFAULT_MODELS, DEFAULT_TOKENS
from .common import parse_timeout
from ..compose.full_save import parse_state_dicts


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
    return plan.VerifyOptions(shapes=shape_kwargs, tokens=tokens, steps=steps, warmup=int(warmup), tolerance_pct=tol,
                              ckpt_tolerance_pct=ckpt_tol, ckpt_reps=ckpt_reps, timeout_s=timeout_s,
                              profiles=profiles, backend=args.backend, lab=args.lab, nproc=args.nproc,
                              calibration=args.calibration, calibrate_only=args.calibrate_only,
                              checkpoint=checkpoint, ckpt_dir=args.ckpt_dir, state_dicts=state_dicts, json=args.json,
                              results_dir=args.results_dir)


def run_fsdp(args: argparse.Namespace) -> int:
    if args.phase_spec:
        return vrun.run_phase(args.phase_spec)
    vrun.refuse_in_world()
    return vrun.run_fsdp(options(args))
