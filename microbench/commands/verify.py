"""`microbench verify fsdp`: real FSDP2 transformer steps and DCP checkpoints, predicted by the
composer from probes run in the same invocation, with the error and a verdict.

Flags are declared once in verify's sections (verify/options.py, verify/fsdp/options.py,
verify/job/options.py); the command parses them into the typed options and runs the phases."""

from __future__ import annotations

import argparse

from ..core import sections
from ..verify import launch
from ..verify.fsdp import options as fsdp_options, plan, run as vrun
from ..verify.job import options as job_flags, plan as jplan


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
    sections.add_sections(f, fsdp_options.FsdpFlags)
    f.add_argument("--phase-spec", default=None, help=argparse.SUPPRESS)
    f.set_defaults(handler=run_fsdp)
    add_job_parser(vs)


def options(args: argparse.Namespace) -> plan.VerifyOptions:
    return fsdp_options.resolve(sections.parse_sections(fsdp_options.FsdpFlags, args))


def run_fsdp(args: argparse.Namespace) -> int:
    if args.phase_spec:
        vrun.run_phase(args.phase_spec)
    launch.refuse_in_world("verify fsdp")
    return vrun.run_fsdp(options(args))


# --------------------------------------------------------------------------- verify job

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
    sections.add_sections(j, job_flags.JobFlags)
    j.add_argument("--phase-spec", default=None, help=argparse.SUPPRESS)
    j.set_defaults(handler=run_job)


def job_options(args: argparse.Namespace) -> jplan.JobOptions:
    return job_flags.resolve(sections.parse_sections(job_flags.JobFlags, args))


def run_job(args: argparse.Namespace) -> int:
    from ..verify.job import run as job_run

    if args.phase_spec:
        job_run.run_phase(args.phase_spec)
    launch.refuse_in_world("verify job")
    return job_run.run_job(job_options(args))
