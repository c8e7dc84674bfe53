"""`compose --steps/--tokens`: the job model built from the composer's inputs (the job asked for, the
sources of data and model, the checkpoint targets per network) and the assumptions it runs with;
report.py prices and prints it."""

from __future__ import annotations

from typing import Any

from . import inputs as ji
from .whatif import JobModel


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
    choices = {
        "data": ji.pick("data", "--data", data, job.data, sorted(set(names) | set(data)), unreadable),
        "model_from": ji.pick(
            "model load", "--model-from", models, job.model_from, sorted(set(names) | set(models)), unreadable
        ),
        "ckpt_to": ji.pick("checkpoints", "--ckpt-to", {n: n for n in names}, job.ckpt_to, names, []),
    }
    state_dict = given.state_dicts[0]
    gpu = given.rate.gpu
    ckpt = {}
    for net in given.networks:
        ckpt[net.name] = ji.ckpt_targets(
            tiers,
            checkpoint_bytes,
            state_dict=state_dict,
            fmt=opts.storage.save_format,
            async_ckpt=job.async_ckpt,
            staging_gbps=gpu.host_link_gbps * given.world if gpu else None,
            full_args={
                "unit_bytes": 4.0 * given.model.block_params,
                "ranks": given.world,
                "curve": net.all_gather,
                "host_link_gbps": gpu.host_link_gbps if gpu else None,
                "serialize_gbps": given.serialize_gbps,
                "nodes": given.nodes or 1,
            },
        )
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
    notes = [
        f"data: {sample_how}" if any(d.sample_bytes for d in data.values()) else "",
        f"checkpoints: {state_dict} state dict"
        + (
            f" (--state-dict lists {', '.join(given.state_dicts)}: the job uses the first)"
            if len(given.state_dicts) > 1
            else ""
        ),
        "async: the staging copy to host memory blocks (needs --gpu for its host link: taken as 0 without)"
        if job.async_ckpt and state_dict == "sharded" and gpu is None
        else "",
        "async applies to sharded DCP saves; a full state dict is saved synchronously"
        if job.async_ckpt and state_dict == "full"
        else "",
        *[t.note for t in tiers if t.note],
    ]
    return model, [n for n in notes if n]
