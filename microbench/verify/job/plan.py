"""What `microbench verify job` will run, checked before any rank starts: the job (steps,
checkpoint interval, async), the storage assignment per phase (or the matrix's), the tiers,
the link profiles and the model.

A tier is where one phase's bytes live: `dir` (a local directory), `s3` (the embedded S3 server,
over the API) or `mount` (the embedded server's bucket through an rclone cached mount). An
assignment names a tier for each of the three phases: batches (--data), the model (--model-from)
and checkpoints (--ckpt-to)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...compose.job.assignment import PHASE_FLAGS, Assignment
from ...core.errors import UsageError
from ...core.units import parse_number, parse_positive_int, parse_size

TIERS = ("dir", "s3", "mount")

# The matrix: everything on a local directory, and everything on the object store (batches and
# the model over the S3 API, checkpoints to a cached mount of the same bucket: the tier per phase
# a published 12B finetune recommends). Without FUSE the checkpoints go to S3 instead.
MATRIX = (Assignment("dir", "dir", "dir"), Assignment("s3", "s3", "mount"))
MATRIX_NO_FUSE = (Assignment("dir", "dir", "dir"), Assignment("s3", "s3", "s3"))
MATRIX_PROFILES = "unlimited,1gbit"


@dataclass
class JobOptions:
    """What verify job runs, resolved from its flags (job/options.py builds it; job/run.run_job takes it)."""
    shape: dict[str, Any]                    # the keyword arguments of model.shape_from_args
    tokens: int
    steps: int
    ckpt_every: int | None
    async_ckpt: bool
    assignments: list[Assignment]
    profiles: list[tuple[str, int | None]]
    tolerance_pct: float
    batch_size: int
    sample_bytes: int
    workers: int
    write_back_s: float
    timeout_s: float
    backend: str = "auto"
    lab: str | None = None
    matrix: bool = False
    nproc: int | None = None
    calibration: str | None = None
    cal_reps: int | None = None             # timed steps per calibration number (None: each one's default)
    base_dir: str | None = None
    json: str | None = None
    results_dir: str = "results"
    notes: list[str] = field(default_factory=list)


def tier(text: str | None, flag: str) -> str:
    value = (text or "dir").strip().lower()
    if value not in TIERS:
        raise UsageError(f"unknown tier {text!r} for {flag}: expected one of {', '.join(TIERS)} (dir: a local "
                         f"directory, s3: the embedded S3 server, mount: its bucket through a cached rclone "
                         f"mount), e.g. {flag} s3")
    return value


def steps(text: str) -> int:
    return parse_positive_int(text, what="--steps", example="12")


def ckpt_every(text: str | None) -> int | None:
    if text is None or str(text).strip().lower() in ("none", "final"):
        return None
    return parse_positive_int(text, what="--ckpt-every", example="4")


def sample_bytes(text: str) -> int:
    value = parse_size(text, what="--sample-size")
    if value < 1:
        raise UsageError(f"invalid --sample-size {text!r}: expected a size of at least 1 byte, e.g. --sample-size 4K")
    return value


def workers(text: str) -> int:
    return int(parse_number(text, what="--workers", example="1", minimum=0, maximum=64))


def check_tokens_fit(tokens: int, batch_size: int, sample_size: int) -> None:
    """A step's ids come from its batch's bytes: the batch must hold tokens + 1 of them."""
    if batch_size * sample_size < tokens + 1:
        raise UsageError(f"--batch-size {batch_size} x --sample-size {sample_size} bytes is less than the "
                         f"{tokens + 1} token ids a step of --tokens {tokens} takes from its batch; use a larger "
                         f"--sample-size, e.g. --sample-size {max(4096, tokens + 1)}")


def assignments(data: str | None, model: str | None, ckpt: str | None, matrix: bool,
                fuse_reason: str | None) -> tuple[list[Assignment], list[str]]:
    """The assignments to run and notes for the record. --matrix with tier flags is misuse."""
    given = [flag for flag, value in zip(PHASE_FLAGS.values(), (data, model, ckpt), strict=False) if value is not None]
    if matrix:
        if given:
            raise UsageError(f"--matrix runs its own storage assignments; drop {', '.join(given)} or --matrix")
        if fuse_reason:
            return list(MATRIX_NO_FUSE), [f"checkpoints go to s3 instead of a cached mount: {fuse_reason}"]
        return list(MATRIX), []
    chosen = Assignment(tier(data, "--data"), tier(model, "--model-from"), tier(ckpt, "--ckpt-to"))
    if "mount" in chosen.tiers() and fuse_reason:
        raise UsageError(f"a mount tier needs FUSE: {fuse_reason}; use dir or s3, e.g. --ckpt-to s3")
    return [chosen], []
