"""`verify fsdp`'s flags, declared once (core/sections.py): the model, the steps and their
verdict, the checkpoint, and verify's shared sections (verify/options.py). `resolve` turns the
parsed sections into the VerifyOptions the run takes, refusing misuse that takes two flags to see."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from ...compose.checkpoint.full import parse_state_dicts
from ...core.options import option
from ...core.units import parse_number
from .. import model as fm
from ..options import Calibrating, Output, Ranks, tolerance, whole
from . import plan

MODEL_HELP = f"a verify preset ({', '.join(fm.PRESETS)}) or a composer preset"


@dataclass
class Model:
    TITLE: ClassVar[str] = "model"
    DESCRIPTION: ClassVar[str] = "the transformer trained: a preset, or its dimensions"
    model: str | None = option(None, shown=f"small; with --matrix: {plan.DEFAULT_MODELS}", help=MODEL_HELP)
    models: str | None = option(None, shown=plan.DEFAULT_MODELS, help="with --matrix: comma-separated models")
    hidden: int | None = option(None, parse=whole("512"), shown="the preset's",
                                help="hidden size instead of a preset (heads of 64, kv heads half, ffn 8/3 h, "
                                     "like the presets)")
    layers: int | None = option(None, parse=whole("4"), shown="the preset's",
                                help="transformer blocks (FSDP units besides the root)")
    heads: int | None = option(None, parse=whole("8"), shown="hidden / 64", help="attention heads")
    vocab: int | None = option(None, parse=whole("4096"), shown="4096", help="vocabulary size")


def _tokens(text: Any, flag: str) -> list[int]:
    return plan.ints(text, flag, "256")


def _warmup(text: Any, flag: str) -> int:
    return int(parse_number(text, what=flag, example="2", minimum=0, maximum=100))


@dataclass
class Steps:
    TITLE: ClassVar[str] = "steps"
    DESCRIPTION: ClassVar[str] = "the real fully_shard steps timed and the verdict on them"
    tokens: list[int] | None = option(None, parse=_tokens, shown=f"256; with --matrix: {plan.DEFAULT_TOKENS}",
                                      help="tokens per rank per step, comma-separated for several")
    steps: int = option(6, parse=whole("5"), help="timed steps per configuration")
    warmup: int = option(2, parse=_warmup, help="untimed steps first")
    sharding: list[str] = option(["full"], parse=lambda text, flag: plan.shardings(text),
                                 help="full (fully_shard over the world), hybrid (HSDP: a 2-D mesh, sharded within a "
                                      "node, replicated across nodes) or full,hybrid")
    tolerance_pct: float = option(10, flag="--tolerance", metavar="PCT", parse=tolerance("10"),
                                  help="largest |error| in percent for a step")
    matrix: bool = option(False, switch=True, shown="off",
                          help="the held-out grid: models x token counts x link profiles, plus the checkpoint to a "
                               "directory and to S3")
    calibrate_only: bool = option(False, switch=True, shown="off",
                                  help="only calibrate; write the record `compose --calibration` reads (with --json "
                                       "PATH)")


@dataclass
class Checkpoint:
    TITLE: ClassVar[str] = "checkpoint"
    DESCRIPTION: ClassVar[str] = "a real DCP save and load of the trained state, predicted from the checkpoint probe"
    checkpoint: bool | None = option(None, shown="on with --matrix",
                                     help="verify DCP save/load to a directory and the embedded S3")
    ckpt_dir: str | None = option(None, shown="a temporary directory, removed afterwards",
                                  help="directory target for the checkpoint")
    state_dict: list[str] = option(["sharded"], parse=lambda text, flag: parse_state_dicts(text),
                                   help="with --checkpoint: sharded (DCP), full (gathered to rank 0, torch.save) or "
                                        "full,sharded")
    ckpt_reps: int = option(9, parse=whole("3"),
                            help="timed saves and loads per target, each beside a probe save and load; rows are "
                                 "medians, and a small checkpoint's cold reads are noisy")
    ckpt_tolerance_pct: float = option(15, flag="--ckpt-tolerance", metavar="PCT", parse=tolerance("10"),
                                       help="largest |error| in percent for checkpoint save and load")


@dataclass
class FsdpFlags:
    model: Model = field(default_factory=Model)
    steps: Steps = field(default_factory=Steps)
    checkpoint: Checkpoint = field(default_factory=Checkpoint)
    ranks: Ranks = field(default_factory=Ranks)
    calibration: Calibrating = field(default_factory=Calibrating)
    output: Output = field(default_factory=Output)


def resolve(flags: FsdpFlags) -> plan.VerifyOptions:
    m, s, c, r = flags.model, flags.steps, flags.checkpoint, flags.ranks
    shape_kwargs = plan.shapes(m.model, m.models, {"hidden": m.hidden, "layers": m.layers, "heads": m.heads,
                                                   "vocab": m.vocab}, s.matrix)
    tokens = s.tokens or plan.ints(plan.DEFAULT_TOKENS if s.matrix else "256", "--tokens", "256")
    checkpoint = (s.matrix if c.checkpoint is None else c.checkpoint) and not s.calibrate_only
    return plan.VerifyOptions(shapes=shape_kwargs, tokens=tokens, steps=s.steps, warmup=s.warmup,
                              tolerance_pct=s.tolerance_pct, ckpt_tolerance_pct=c.ckpt_tolerance_pct,
                              ckpt_reps=c.ckpt_reps, timeout_s=r.timeout_s, profiles=r.profiles(), backend=r.backend,
                              lab=r.lab, nproc=r.nproc, calibration=flags.calibration.calibration,
                              calibrate_only=s.calibrate_only, checkpoint=checkpoint, ckpt_dir=c.ckpt_dir,
                              state_dicts=c.state_dict, json=flags.output.json, results_dir=flags.output.results_dir,
                              shardings=s.sharding, cal_reps=flags.calibration.cal_reps)
