"""The whole job's inputs: what `compose --steps/--tokens` asks for, and every storage
choice per phase turned into costs the timeline (compose/job/timeline.py) adds up.

Sources per phase, by name (a `--data`/`--model-from`/`--ckpt-to` value names one):
  data        every --dataload record and --data-rate (their names), and every tier with a read
              rate: one rank's loader reads at read GB/s / ranks, prefetching, samples of
              --sample-bytes (default: seq-len token ids of 4 bytes, pre-tokenized; stated).
  model-from  every --modelload record, and every tier with a read rate: weight bytes / read GB/s
              (compose/dataload.model_loads).
  ckpt-to     every tier: the save (sharded: bytes / aggregate write; full: compose/checkpoint/full.py)
              blocks; an async save blocks for the staging copy and drains the save; a cached
              mount blocks for the cache write and drains at the bucket's rate, queued.
Each cost takes a factor on the tier's bandwidth (what-if: how much faster would change the
answer), so the costs are functions, evaluated per configuration.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

from ...core.errors import UsageError
from ...core.units import DTYPE_BYTES
from .. import dataload
from ..checkpoint import full as fs
from ..checkpoint.mount import MountTier
from ..inputs.parsers import MAX_STEPS
from ..inputs.sections import Job, Loading
from ..tiers import Tier
from .timeline import JobPlan, steps_for_tokens

TOKEN_ID_BYTES = 4      # pre-tokenized samples as uint32/int32 token ids


@dataclass(frozen=True)
class JobAsk:
    steps: int
    ckpt_every: int | None            # None: from --ckpt-interval, per configuration (its save and step)
    async_ckpt: bool
    tokens_per_step: int
    data: list[str] | None            # names asked for, or None: every source
    model_from: list[str] | None
    ckpt_to: list[str] | None
    steps_source: str

    def plan(self, ckpt_every: int | None) -> JobPlan:
        return JobPlan(self.steps, ckpt_every, self.async_ckpt, True, self.tokens_per_step)


def ask(job: Job, tokens_per_step: int) -> JobAsk | None:
    """The job asked for (--steps or --tokens), or None; the job flags without either were
    refused when argv was read (inputs/sections.Job.check)."""
    if not job.asked:
        return None
    if job.steps is not None:
        steps, source = job.steps, f"--steps {job.steps}"
    else:
        assert job.tokens is not None
        steps = steps_for_tokens(int(job.tokens.value), tokens_per_step)
        if steps > MAX_STEPS:
            raise UsageError(f"--tokens {job.tokens.text} is {steps:,} steps of {tokens_per_step:,} tokens, more than "
                             f"{MAX_STEPS:,}; expected fewer tokens or larger steps, e.g. --tokens 1e9")
        source = f"--tokens {job.tokens.text}: {steps} steps of {tokens_per_step:,} tokens"
    return JobAsk(steps, job.ckpt_every, job.async_ckpt, tokens_per_step, job.data, job.model_from, job.ckpt_to, source)


@dataclass(frozen=True)
class CkptTarget:
    """One tier as a checkpoint destination on one network: costs(f) -> (blocking s, drain s,
    drain blocks the next save), f a factor on the tier's bandwidth."""
    name: str
    durable: bool
    readable: bool
    how: str
    costs: Callable[[float], tuple[float, float, bool, float]]   # blocking, drain, blocks next, drain's fixed delay


def pick(kind: str, flag: str, available: dict[str, Any], asked: list[str] | None,
         known: list[str], unreadable: list[str]) -> list[str]:
    """The names a phase may use: those asked for (each checked), or every one available."""
    if asked is None:
        if not available:
            need = "a tier" if flag == "--ckpt-to" else "a tier with a read rate or a record"
            raise UsageError(f"the job's {kind} needs {need}: give e.g. --tier shared=1.6:6.4"
                             + (" or --data-rate shared=900" if flag == "--data" else ""))
        return list(available)
    for name in asked:
        if name in unreadable:
            raise UsageError(f"{flag} {name}: tier {name!r} has no read bandwidth, and {kind} reads; give it one, "
                             f"e.g. --tier {name}=W:R such as --tier {name}=1.6:6.4")
        if name not in available:
            raise UsageError(f"{flag} {name}: no such tier; expected one of {', '.join(known) or 'none given'}, "
                             f"e.g. --tier {name}=1.6:6.4 {flag} {name}")
    return asked


def data_sources(loading: Loading, tiers: list[Tier], ranks: int, seq_len: int,
                 load: Callable[[str], dict[str, Any]]) -> tuple[dict[str, dataload.DataRate], str]:
    """{name: loader rate per rank}, and how the sample size was chosen."""
    if loading.sample_bytes is not None:
        sample, how = loading.sample_bytes.value, f"--sample-bytes {loading.sample_bytes.text}"
    else:
        sample = float(seq_len * TOKEN_ID_BYTES)
        how = (f"assumed {sample / 1e3:,.1f} kB per sample (seq-len {seq_len} x {TOKEN_ID_BYTES}-byte token ids, "
               f"pre-tokenized; give --sample-bytes)")
    out: dict[str, dataload.DataRate] = {}
    records = [(r.name, r.path) for r in loading.dataload]
    for rate in dataload.data_rates(records, loading.data_rate, sample, load):
        out.setdefault(rate.name, rate)
    for t in tiers:
        if t.read_gbps and t.name not in out:
            out[t.name] = dataload.DataRate(t.name, t.read_gbps * 1e9 / ranks / sample, True,
                                            f"{t.source} (read / {ranks} ranks / {sample:,.0f} B)", sample)
    return out, how


def model_sources(loading: Loading, tiers: list[Tier], weight_bytes: float,
                  load: Callable[[str], dict[str, Any]]) -> dict[str, dataload.ModelLoad]:
    out: dict[str, dataload.ModelLoad] = {}
    for m in dataload.model_loads([(r.name, r.path) for r in loading.modelload], tiers, weight_bytes, None, load):
        out.setdefault(m.tier, m)
    return out


def ckpt_targets(tiers: list[Tier], ckpt_bytes: float, *, state_dict: str, fmt: str | None,
                 async_ckpt: bool, staging_gbps: float | None, full_args: dict[str, Any]) -> dict[str, CkptTarget]:
    """One target per tier for one network (a full save gathers over it: full_args["curve"])."""
    out = {}
    stage_s = ckpt_bytes / (staging_gbps * 1e9) if staging_gbps else 0.0
    gathered = fs.gather_s(ckpt_bytes, full_args["unit_bytes"], full_args["ranks"], full_args["curve"]) \
        if state_dict == "full" else 0.0
    for t in tiers:
        mount = t.mount
        cached = t.cached

        def save_s(f: float, t: Tier = t) -> float:
            if state_dict == "sharded":
                return ckpt_bytes / (t.write_gbps * f * 1e9)
            return fs.full_save(t.name, ckpt_bytes, gather_time_s=gathered,
                                host_link_gbps=full_args["host_link_gbps"], serialize_gbps=full_args["serialize_gbps"],
                                stream_gbps=t.stream_gbps * f if t.stream_gbps else None,
                                aggregate_gbps=t.write_gbps * f, nodes=full_args["nodes"],
                                aggregate_is_job=t.aggregate_is_job, fmt=fs.save_format("full", fmt)).save_s

        def costs(f: float, mount: MountTier | None = mount, cached: bool = cached,
                  save_s: Callable[[float], float] = save_s) -> tuple[float, float, bool, float]:
            delay = mount.write_back_s if cached and mount else 0.0
            upload = (delay + ckpt_bytes / (mount.drain_gbps * f * 1e9)) if cached and mount else 0.0
            if async_ckpt and state_dict == "sharded":
                # DCP async_save: the staging copy blocks; the write (and a mount's upload) drains.
                return stage_s, save_s(f) + upload, not cached, 0.0
            # A mount's write-back queues (it does not block the next save); its delay runs beside
            # the earlier uploads (compose/job.PhaseCosts.drain_delay_s).
            return save_s(f), upload, not cached, delay

        how = (
            "cached mount: blocks on the cache write, uploads queued"
            if cached
            else "async: staging copy blocks, the save drains"
            if async_ckpt and state_dict == "sharded"
            else "blocking save"
        )
        out[t.name] = CkptTarget(t.name, t.durable, bool(t.read_gbps), how, costs)
    return out


def weight_bytes(model: Any, param_dtype: str) -> float:
    return model.total_params * DTYPE_BYTES[param_dtype]


def scaled_rate(rate: dataload.DataRate, f: float) -> dataload.DataRate:
    return rate if f == 1 else replace(rate, samples_per_s_per_rank=rate.samples_per_s_per_rank * f)
