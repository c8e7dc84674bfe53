"""compose's flags about the job around the steps: checkpoint storage, data loading, the job's length and
failures, and where the output goes (one section per --help group, declared as sections.py says)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ...core.errors import UsageError
from ...core.options import option
from ..checkpoint import full as fs
from ..dataload import DataRate
from ..tiers import described
from .parsers import (
    MAX_STEPS,
    NamedRecord,
    SerializeRate,
    Typed,
    count,
    data_rate,
    duration,
    hours,
    named_record,
    overhead_fraction,
    sample_bytes,
    save_format,
    serialize_rate,
    size,
    state_dicts,
    tier_names,
    tokens,
)


@dataclass
class Storage:
    TITLE: ClassVar[str] = "checkpoint"
    tier: list[described.DescribedTier] = option(
        [],
        parse=described.parse,
        repeat=True,
        metavar="NAME=WRITE[:READ]",
        shown="none",
        help="a storage tier by the aggregate GB/s the job gets, e.g. --tier nvme=6:12; ,ephemeral: not durable (a "
        "node-local disk); a bucket mount adds ,direct or ,cached,drain=GB/S[,delay=5s], or ,cached alone: "
        "WRITE:READ are the bucket's, the cache is cache=GB/S or the fastest ephemeral tier (repeatable)",
    )
    storage: list[NamedRecord] = option(
        [],
        parse=named_record,
        repeat=True,
        metavar="[NAME=]RECORD",
        shown="none",
        help="a storage or checkpoint record as a tier (its best write and read), e.g. "
        "results/suite-*/storage-posix.json (repeatable)",
    )
    state_dict: list[str] = option(
        ["sharded"],
        parse=state_dicts,
        metavar="STATE_DICT",
        help="sharded (a DCP save, every rank at once), full (gathered to rank 0, one "
        "process writes: Accelerate/Trainer's FULL_STATE_DICT) or full,sharded",
    )
    save_format: str | None = option(
        None,
        parse=save_format,
        shown="dcp for sharded, torch for full",
        help="dcp (sharded), torch or safetensors (full)",
    )
    serialize_rate: SerializeRate | None = option(
        None,
        parse=serialize_rate,
        metavar="GB/S|RECORD",
        shown="2 GB/s, assumed",
        help="one process's torch.save rate, or a `checkpoint --state-dict full` record",
    )
    host_memory: int | None = option(
        None,
        parse=size,
        metavar="SIZE",
        shown="none: not checked",
        help="host memory free on rank 0's node, for a full save, e.g. 1T",
    )
    mtbf_hours: float | None = option(
        None,
        parse=hours,
        shown="none: no Young/Daly interval",
        help="the job's mean time between failures, for the Young/Daly interval, e.g. 24",
    )
    ckpt_interval: float = option(
        1800.0,
        parse=duration("30min", allow_zero=False),
        shown="30min",
        help="checkpoint interval for the bandwidth needed, and the job's (--steps) without --ckpt-every",
    )
    ckpt_overhead: float = option(
        0.05, parse=overhead_fraction, shown="5%", help="share of time a blocking save may cost"
    )

    def check(self) -> None:
        for sd in self.state_dict:
            fs.save_format(sd, self.save_format)


@dataclass
class Loading:
    TITLE: ClassVar[str] = "data and model loading"
    dataload: list[NamedRecord] = option(
        [],
        parse=named_record,
        repeat=True,
        metavar="[NAME=]RECORD",
        shown="none",
        help="a `microbench dataload` record: the loader's rate per rank (repeatable)",
    )
    data_rate: list[DataRate] = option(
        [],
        parse=data_rate,
        repeat=True,
        metavar="NAME=SAMPLES/S",
        shown="none",
        help="a described loader rate per rank, prefetching, e.g. --data-rate s3=900 (repeatable)",
    )
    sample_bytes: Typed | None = option(
        None, parse=sample_bytes, metavar="SIZE", shown="the record's", help="bytes per training sample"
    )
    modelload: list[NamedRecord] = option(
        [],
        parse=named_record,
        repeat=True,
        metavar="[NAME=]RECORD",
        shown="none",
        help="a `microbench modelload` record: model load time at start and each "
        "restart (repeatable); every --tier/--storage with a read rate gives "
        "one too",
    )


@dataclass
class Job:
    TITLE: ClassVar[str] = "the whole job (a timeline, the what-if per storage assignment, a recommendation)"
    steps: int | None = option(
        None,
        parse=count("80", MAX_STEPS),
        shown="none: no job",
        help="train this many optimizer steps, e.g. 80 (asks for the job)",
    )
    tokens: Typed | None = option(
        None, parse=tokens, shown="none: no job", help="or train this many tokens, e.g. 1e9 (steps rounded up)"
    )
    ckpt_every: int | None = option(
        None, parse=count("5", MAX_STEPS), metavar="K", shown="from --ckpt-interval", help="a checkpoint every K steps"
    )
    async_ckpt: bool = option(
        False, switch=True, shown="off", help="async DCP saves: the staging copy blocks, the write drains"
    )
    data: list[str] | None = option(
        None,
        parse=tier_names,
        metavar="TIER[,TIER]",
        shown="every tier the inputs allow",
        help="where batches come from: tier names, a comma list",
    )
    model_from: list[str] | None = option(
        None,
        parse=tier_names,
        metavar="TIER[,TIER]",
        shown="every tier the inputs allow",
        help="where the model at start and after a restart comes from: tier names, a comma list",
    )
    ckpt_to: list[str] | None = option(
        None,
        parse=tier_names,
        metavar="TIER[,TIER]",
        shown="every tier the inputs allow",
        help="where checkpoints go to: tier names, a comma list",
    )

    @property
    def asked(self) -> bool:
        return self.steps is not None or self.tokens is not None

    def check(self) -> None:
        if not self.asked:
            given = [
                f
                for f, v in (
                    ("--ckpt-every", self.ckpt_every),
                    ("--data", self.data),
                    ("--model-from", self.model_from),
                    ("--ckpt-to", self.ckpt_to),
                    ("--async-ckpt", self.async_ckpt or None),
                )
                if v is not None
            ]
            if given:
                raise UsageError(f"{given[0]} describes a job: give its length too, e.g. --steps 80 (or --tokens 1e9)")
        elif self.steps is not None and self.tokens is not None:
            raise UsageError(
                f"--steps {self.steps} and --tokens {self.tokens.text} both give the job's length; give "
                f"one, e.g. --steps 80"
            )


@dataclass
class Output:
    TITLE: ClassVar[str] = "output"
    json: str | None = option(
        None, metavar="PATH", record=False, shown="results/compose-TIME.json", help="write the compose record here"
    )
    csv: str | None = option(
        None, metavar="PATH", record=False, shown="none", help="also write the predictions as CSV rows"
    )
    results_dir: str = option("results", metavar="DIR", record=False, help="where the record goes without --json")
