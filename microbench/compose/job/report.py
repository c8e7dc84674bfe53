"""`compose --steps/--tokens`: the job model built from the composer's inputs, and what the
command prints and the record keeps: the job table of the recommended configuration, the ranked
what-if and the recommendation with what would change it."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ..checkpoint.mount import Period
from ..report import format_time
from . import inputs as ji
from .assignment import PHASE_FLAGS
from .timeline import KINDS, JobTimeline, Phase
from .whatif import MAX_FACTOR, JobModel, WhatIf, rows, whatif

WHATIF_ROWS = 30          # printed; the record keeps every row
RECORD_PHASES = 400       # a timeline with more is recorded with its identical periods folded
KIND_LABELS = {"model_load": "model load", "train": "training steps", "data_stall": "data stall",
               "ckpt_blocking": "checkpoint (blocking)", "ckpt_wait": "wait for the previous checkpoint",
               "ckpt_drain": "drain (overlapped)", "final_save": "final save until durable"}


def build(given: Any, checkpoint_bytes: float, step_s: dict[str, float]) -> tuple[JobModel, list[str]] | None:
    """The job model (None when no job was asked for) and the assumptions it ran with."""
    train, load, opts = given.train, given.load, given.options
    tokens_per_step = given.world * train.micro_batch * train.grad_accum * train.seq_len
    job = ji.ask(opts.job, tokens_per_step)
    if job is None:
        return None
    tiers = given.tiers
    data, sample_how = ji.data_sources(opts.loading, tiers, given.world, train.seq_len, load)
    models = ji.model_sources(opts.loading, tiers, ji.weight_bytes(given.model, train.param_dtype), load)
    unreadable = [t.name for t in tiers if not t.read_gbps]
    names = [t.name for t in tiers]
    choices = {"data": ji.pick("data", "--data", data, job.data, sorted(set(names) | set(data)), unreadable),
               "model_from": ji.pick("model load", "--model-from", models, job.model_from,
                                     sorted(set(names) | set(models)), unreadable),
               "ckpt_to": ji.pick("checkpoints", "--ckpt-to", {n: n for n in names}, job.ckpt_to, names, [])}
    state_dict = given.state_dicts[0]
    gpu = given.rate.gpu
    ckpt = {}
    for net in given.networks:
        ckpt[net.name] = ji.ckpt_targets(
            tiers, checkpoint_bytes, state_dict=state_dict, fmt=opts.storage.save_format, async_ckpt=job.async_ckpt,
            staging_gbps=gpu.host_link_gbps * given.world if gpu else None,
            full_args={"unit_bytes": 4.0 * given.model.block_params, "ranks": given.world, "curve": net.all_gather,
                       "host_link_gbps": gpu.host_link_gbps if gpu else None, "serialize_gbps": given.serialize_gbps,
                       "nodes": given.nodes or 1})
    model = JobModel(
        job,
        dict(step_s),
        train.micro_batch * train.grad_accum,
        data,
        models,
        ckpt,
        given.interval_s,
        choices,
        job.ckpt_to is not None,
    )
    notes = [f"data: {sample_how}" if any(d.sample_bytes for d in data.values()) else "",
             f"checkpoints: {state_dict} state dict"
             + (f" (--state-dict lists {', '.join(given.state_dicts)}: the job uses the first)"
                if len(given.state_dicts) > 1 else ""),
             "async: the staging copy to host memory blocks (needs --gpu for its host link: taken as 0 without)"
             if job.async_ckpt and state_dict == "sharded" and gpu is None else "",
             "async applies to sharded DCP saves; a full state dict is saved synchronously"
             if job.async_ckpt and state_dict == "full" else "",
             *[t.note for t in tiers if t.note]]
    return model, [n for n in notes if n]


def _every(model: JobModel, every: int | None) -> str:
    if model.ask.ckpt_every is not None:
        return f"a checkpoint every {model.ask.ckpt_every} steps (--ckpt-every)"
    if every is not None and every >= model.ask.steps:
        return f"no checkpoint before the final save (--ckpt-interval {format_time(model.interval_s)}: {every} steps)"
    return f"a checkpoint every {every} steps (--ckpt-interval {format_time(model.interval_s)})"


def _periods(phases: tuple[Phase, ...]) -> list[list[Phase]]:
    """Phases grouped into periods, each starting with a training stretch."""
    out: list[list[Phase]] = []
    for p in phases:
        if p.kind == "train" or not out:
            out.append([])
        out[-1].append(p)
    return out


def _runs(periods: list[list[Phase]]) -> list[tuple[int, int]]:
    """[start, end) runs of identical periods in a row (the same kinds and times)."""
    out, i = [], 0
    while i < len(periods):
        sig = [(p.kind, round(p.time_s, 9)) for p in periods[i]]
        j = i + 1
        while j < len(periods) and [(p.kind, round(p.time_s, 9)) for p in periods[j]] == sig:
            j += 1
        out.append((i, j))
        i = j
    return out


def timeline_dict(job: JobTimeline) -> dict[str, Any]:
    """JobTimeline.as_dict; past RECORD_PHASES phases, each run of identical periods is kept as its
    first period and one "repeat" entry (how many more, each period_s long, drawn from its first:
    the "template"), so a job of 10,000 steps stays a small record and a picture."""
    out = job.as_dict()
    if len(job.phases) <= RECORD_PHASES:
        return out
    periods, phases = _periods(job.phases), []
    for i, j in _runs(periods):
        phases += [asdict(p) for p in periods[i]]
        if j - i > 1:
            first = periods[i + 1]
            period = sum(p.time_s for p in first if not p.overlapped)
            phases.append({"name": f"{j - i - 1} more periods like it", "kind": "repeat", "start_s": first[0].start_s,
                           "time_s": period * (j - i - 1), "overlapped": False, "repeat": j - i - 1, "period_s": period,
                           "template": [dict(asdict(p), start_s=p.start_s - first[0].start_s) for p in first]})
    out["phases"] = phases
    return out


def job_rows(job: JobTimeline) -> list[tuple[str, str, str, str]]:
    """(phase, start, time, share) in order; identical periods in a row are folded into one line."""
    def row(p: Phase) -> tuple[str, str, str, str]:
        share = "overlapped" if p.overlapped else f"{p.time_s / job.total_s:.1%}" if job.total_s else "-"
        return (("  " if p.overlapped else "") + p.name, format_time(p.start_s), format_time(p.time_s), share)

    out: list[tuple[str, str, str, str]] = []
    periods = _periods(job.phases)
    for i, j in _runs(periods):
        out += [row(p) for p in periods[i]]
        if j - i > 1:
            first, last = periods[i + 1][0], periods[j - 1][-1]
            span = sum(p.time_s for q in periods[i + 1:j] for p in q if not p.overlapped)
            out.append((f"... {j - i - 1} more periods like it ({first.name} .. {last.name.split(',')[0]})",
                        format_time(first.start_s), format_time(span), f"{span / job.total_s:.1%}"))
    return out


def lines(model: JobModel, result: WhatIf, notes: list[str], fits: bool | None) -> list[str]:
    from tabulate import tabulate

    top = result.best or result.outcomes[0]
    ask = model.ask
    out = [f"\n## job: {ask.steps} steps ({ask.steps_source}), {_every(model, top.ckpt_every)}, "
           f"{'async' if ask.async_ckpt else 'synchronous'} saves, {ask.tokens_per_step:,} tokens per step"
           + ("  [DOES NOT FIT in memory: times are for reference]" if fits is False else "")]
    out += [f"# {n}" for n in notes]
    if top.timeline is None:
        out.append(f"# no configuration trains: {top.never}")
        return out
    job = top.timeline
    out.append(f"# {'recommended' if top is result.best else 'fastest (none meets the constraint)'}: "
               f"{top.config.describe()}")
    out.append(tabulate(job_rows(job) + [("total", "", format_time(job.total_s), "100%")],
                        headers=["phase", "start", "time", "share"], tablefmt="simple", disable_numparse=True))
    kinds = job.time_by_kind()
    out.append(tabulate([(KIND_LABELS[k], format_time(kinds[k]), f"{job.share_by_kind()[k]:.1%}") for k in KINDS
                         if kinds[k] > 0 and k != "ckpt_drain"], headers=["per kind", "time", "share"],
                        tablefmt="simple", disable_numparse=True))
    out.append(f"# total {format_time(job.total_s)}; {job.tokens_per_s:,.0f} tokens/s over the whole job; "
               f"{job.io_share:.1%} of the job on I/O (model load, data stall, checkpoints)")
    out += whatif_lines(model, result) + recommendation_lines(result)
    return out


def whatif_lines(model: JobModel, result: WhatIf) -> list[str]:
    from tabulate import tabulate

    table = rows(result)
    shown = table if len(table) <= WHATIF_ROWS + 5 else table[:WHATIF_ROWS] + table[-3:]
    shown += [r for r in table if r["recommended"] and r not in shown]   # always beside the others
    shown.sort(key=lambda r: r["rank"])
    body = [(r["rank"], r["network"], r["data"], r["model_from"], r["ckpt_to"], r["ckpt_every"] or "-",
             format_time(r["total_s"]) if r["total_s"] is not None else "never trains",
             f"{r['ratio']:.2f}x" if r["ratio"] else "-", f"{r['tokens_per_s']:,.0f}" if r["tokens_per_s"] else "-",
             f"{r['io_share']:.0%}" if r["io_share"] is not None else "-",
             "RECOMMENDED" if r["recommended"] else r["marks"] or ("never trains" if r["never_trains"] else ""))
            for r in shown]
    out = [f"\n## what-if: {len(model.step_s)} network(s) x every storage assignment "
           f"({len(table)} configurations), by total"]
    out.append(tabulate(body, headers=["#", "network", "data", "model from", "ckpt to", "every", "total", "vs rec.",
                                       "tokens/s", "I/O", "marks"], tablefmt="simple", disable_numparse=True))
    if len(shown) < len(table):
        out.append(f"# {len(table) - len(shown)} of {len(table)} rows not printed: every row is in the record")
    out.append("# marked rows checkpoint to an ephemeral tier or resume (--model-from after a restart) from a tier "
               "other than the checkpoint's: shown, never recommended; vs rec.: the total over the recommended's "
               "(the best meeting that constraint), below 1.00x only for marked rows")
    return out


def recommendation_lines(result: WhatIf) -> list[str]:
    from tabulate import tabulate

    out = ["\n## recommendation (checkpoints durable, the restart loads from the checkpoint's tier)"]
    best, worst = result.best, result.worst
    if best is None or worst is None:
        return out + ["# none: every configuration checkpoints to an ephemeral tier, resumes from another tier or "
                      "never trains; add a durable tier (e.g. --tier shared=1.6:6.4)"]
    out.append(f"# best:  {best.config.describe()}: {format_time(best.total_s)}")
    out.append(f"# worst: {worst.config.describe()}: {format_time(worst.total_s)}")
    out.append(f"# end to end: {result.end_to_end:.2f}x between them")
    body = []
    for f in result.flips:
        if f.factor is not None:
            change = f"{f.alternative} {f.factor:.2f}x faster"
        else:
            change = f"no change up to {MAX_FACTOR:g}x"
        body.append((PHASE_FLAGS[f.phase], f.recommended, change, ", ".join(f.ties) or "-"))
    out.append(tabulate(body, headers=["phase", "recommended", "to change the answer (tier bandwidth)",
                                       "ties (same total)"], tablefmt="simple", disable_numparse=True))
    out.append("# the factor: on that phase's use of the other tier (read for data and model load, write and a "
               "mount's drain for checkpoints) at which a configuration using it would beat the recommendation")
    return out


def record(model: JobModel, result: WhatIf, notes: list[str]) -> dict[str, Any]:
    """summary["job"]: the ask, the recommendation, the flips, each configuration (by total) and its
    timeline (an index into "timelines": JobTimeline.as_dict)."""
    def pick(o: Any) -> dict[str, Any] | None:
        return None if o is None else {**o.config.as_dict(), "total_s": o.total_s}

    # A timeline is a function of its plan and costs: configurations that give the same (the data
    # tier rarely changes a total) share one entry, so a large what-if stays a small record.
    timelines: list[dict[str, Any]] = []
    index: dict[Any, int] = {}
    for o in result.outcomes:
        if o.plan is not None and (o.plan, o.costs) not in index:
            built = o.timeline
            assert built is not None   # the what-if prices every plan it keeps
            index[(o.plan, o.costs)] = len(timelines)
            timelines.append(timeline_dict(built))
    return {"steps": model.ask.steps, "ckpt_every": model.ask.ckpt_every, "async_ckpt": model.ask.async_ckpt,
            "tokens_per_step": model.ask.tokens_per_step, "interval_s": model.interval_s, "notes": notes,
            "recommended": pick(result.best), "worst": pick(result.worst), "end_to_end_ratio": result.end_to_end,
            "flips": [{"phase": f.phase, "recommended": f.recommended, "alternative": f.alternative,
                       "factor": f.factor, "ties": f.ties} for f in result.flips],
            "timelines": timelines,
            "configurations": [{**o.config.as_dict(), "marks": list(o.marks), "never_trains": o.never,
                                "total_s": o.total_s if o.plan else None,
                                "timeline": index[(o.plan, o.costs)] if o.plan else None}
                               for o in result.outcomes]}


@dataclass
class JobResult:
    """The job asked for: its model, every configuration ranked, the assumptions it ran with."""
    model: JobModel
    whatif: WhatIf
    notes: list[str]

    def lines(self, fits: bool | None) -> list[str]:
        return lines(self.model, self.whatif, self.notes, fits)

    def summary(self) -> dict[str, Any]:
        return record(self.model, self.whatif, self.notes)

    def rows(self) -> list[dict[str, Any]]:
        return rows(self.whatif)

    def period(self) -> Period | None:
        """The checkpoint period --ckpt-every gives the recommended configuration (the fastest
        when none is recommended): its steps with their data stall; None without --ckpt-every."""
        top = self.whatif.best or self.whatif.outcomes[0]
        every = self.model.ask.ckpt_every
        if every is None or top.costs is None:
            return None
        return Period(every, every * (top.costs.step_s + top.costs.data_stall_s),
                      f"{top.config.network}, data {top.config.data}")


def run(given: Any, checkpoint_bytes: float, step_s: dict[str, float]) -> JobResult | None:
    """The job's what-if, or None without a job (--steps or --tokens)."""
    built = build(given, checkpoint_bytes, step_s)
    if built is None:
        return None
    model, notes = built
    return JobResult(model, whatif(model), notes)
