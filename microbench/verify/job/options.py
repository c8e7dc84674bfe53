"""`verify job`'s flags, declared once (core/sections.py): the job, its data, its storage tiers, and
verify's shared sections (verify/options.py, with a longer --timeout: a job's phases wait on
storage). `resolve` turns the parsed sections into the JobOptions the run takes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from ...core.options import option, timeout
from ...core.units import parse_duration_s
from .. import model as fm
from ..options import TIMEOUT_HELP, Calibrating, Output, Ranks, tolerance, whole
from . import plan


def _ckpt_every(text: Any, flag: str) -> int | None:
    return plan.ckpt_every(text)


@dataclass
class Job:
    TITLE: ClassVar[str] = "job"
    DESCRIPTION: ClassVar[str] = "the short training job run and timed, and the verdict on its total"
    model: str = option("small", help=f"a verify preset ({', '.join(fm.PRESETS)})")
    tokens: int = option(256, parse=whole("256"), help="tokens per rank per step")
    steps: int = option(12, parse=lambda text, flag: plan.steps(text), help="training steps")
    ckpt_every: int | None = option(4, parse=_ckpt_every,
                                    help="steps between checkpoints, or none for the final save only (the last "
                                         "step's save is the final one)")
    async_ckpt: bool = option(False, switch=True, shown="off", help="checkpoint with dcp.async_save")
    tolerance_pct: float = option(15, flag="--tolerance", metavar="PCT", parse=tolerance("15"),
                                  help="largest |error| in percent of the total")
    matrix: bool = option(False, switch=True, shown="off",
                          help="every assignment of the matrix (all dir; data and model from s3 with checkpoints to "
                               "a cached mount) x the link profiles unlimited,1gbit (on --lab, or a two-host lab "
                               "made and removed by the run)")


@dataclass
class Data:
    TITLE: ClassVar[str] = "data"
    DESCRIPTION: ClassVar[str] = "the batches a DataLoader streams from the data tier"
    batch_size: int = option(8, parse=whole("8"), help="samples per step per rank")
    sample_bytes: int = option(
        4096,
        flag="--sample-size",
        metavar="SIZE",
        parse=lambda text, flag: plan.sample_bytes(text),
        help="bytes per sample",
    )
    workers: int = option(1, parse=lambda text, flag: plan.workers(text), help="DataLoader workers per rank")


@dataclass
class Storage:
    TITLE: ClassVar[str] = "storage"
    DESCRIPTION: ClassVar[str] = ("the tier of each phase's bytes: dir (a local directory), s3 (the embedded S3 "
                                  "server) or mount (its bucket through a cached rclone mount)")
    data: str | None = option(None, metavar="TIER", shown="dir", help="where batches come from: dir, s3 or mount")
    model_from: str | None = option(None, metavar="TIER", shown="dir", help="where the model is loaded from")
    ckpt_to: str | None = option(None, metavar="TIER", shown="dir", help="where checkpoints go")
    write_back_s: float = option(1.0, flag="--write-back", metavar="DURATION", shown="1s",
                                 parse=lambda text, flag: parse_duration_s(text, what=flag, example="1s"),
                                 help="mount tier: rclone's write-back delay")
    base_dir: str | None = option(
        None, flag="--dir", metavar="DIR", shown="the temp dir", help="where the dir tier's files go"
    )


@dataclass
class JobRanks(Ranks):
    timeout_s: float = option(180, flag="--timeout", metavar="SECONDS", parse=timeout, help=TIMEOUT_HELP)


@dataclass
class JobFlags:
    job: Job = field(default_factory=Job)
    data: Data = field(default_factory=Data)
    storage: Storage = field(default_factory=Storage)
    ranks: JobRanks = field(default_factory=JobRanks)
    calibration: Calibrating = field(default_factory=Calibrating)
    output: Output = field(default_factory=Output)


def resolve(flags: JobFlags) -> plan.JobOptions:
    from ...targets.mount.system import fuse_unavailable_reason
    from ...targets.workdir import check_base
    from ..options import link_profiles

    j, d, s, r = flags.job, flags.data, flags.storage, flags.ranks
    shape: dict[str, Any] = {"model": j.model, "hidden": None, "layers": None, "heads": None, "vocab": None}
    fm.check_buildable(fm.shape_from_args(**shape))
    plan.check_tokens_fit(j.tokens, d.batch_size, d.sample_bytes)
    needs_fuse = j.matrix or "mount" in {str(t).strip().lower() for t in (s.data, s.model_from, s.ckpt_to) if t}
    fuse = fuse_unavailable_reason() if needs_fuse else None
    chosen, notes = plan.assignments(s.data, s.model_from, s.ckpt_to, j.matrix, fuse)
    profiles = r.profiles()
    if r.link_profiles is None and j.matrix and r.lab:
        profiles = link_profiles(plan.MATRIX_PROFILES, "--link-profiles")
    if s.base_dir is not None:
        # A directory no step could write is misuse, refused before calibration and the job run.
        check_base(s.base_dir, writable=True, flag="--dir")
    return plan.JobOptions(
        shape=shape, tokens=j.tokens, steps=j.steps, ckpt_every=j.ckpt_every, async_ckpt=j.async_ckpt,
        assignments=chosen, profiles=profiles, tolerance_pct=j.tolerance_pct, batch_size=d.batch_size,
        sample_bytes=d.sample_bytes, workers=d.workers, write_back_s=s.write_back_s, timeout_s=r.timeout_s,
        backend=r.backend, lab=r.lab, matrix=j.matrix, nproc=r.nproc, calibration=flags.calibration.calibration,
        cal_reps=flags.calibration.cal_reps, base_dir=s.base_dir, json=flags.output.json,
        results_dir=flags.output.results_dir, notes=notes)
