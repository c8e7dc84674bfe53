"""A checkpoint save as trainers write one: a sharded DCP save (every rank writes its shard at
once, bytes over the tier's aggregate write bandwidth) or a full state dict (Hugging Face
Accelerate/Trainer's FULL_STATE_DICT: the state gathered to rank 0 and written by one process).

A full save costs, one after the other:
  gather     get_state_dict(full_state_dict): one AllGather per tensor over the job's network
             (the composer prices one per FSDP unit's fp32 state: parameters, then AdamW's two
             moments), then, from GPUs, rank 0's copy of the whole state to host memory
             (cpu_offload) over its host link.
  write      torch.save (or safetensors) streams the serialized bytes into one file as it goes,
             so the slower of one process's serialization rate and the tier's single-stream
             write bandwidth bounds it. A single stream is never more than one node's share of a
             tier whose bandwidth is the job's aggregate (--tier), nor more than a measured
             record's own aggregate.
It needs host memory for the whole state on rank 0's node (twice that for safetensors, which
builds the file in memory).

Pure: numbers in, numbers out; the curve is any object with `time_s(size_bytes, ranks)`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from ...core.errors import UsageError

STATE_DICTS = ("sharded", "full")
SAVE_FORMATS = ("dcp", "torch", "safetensors")
# One process's torch.save rate when neither a checkpoint record nor a rate is given: what
# `checkpoint --state-dict full` measured for serialize+write into the page cache on this
# project's machines (1.6-6 GB/s); stated as assumed in the output.
DEFAULT_SERIALIZE_GBPS = 2.0
MEASURE_STREAM = "`microbench storage posix --path DIR` (its 1-stream case) or `microbench storage s3`"
MEASURE_DCP = "`microbench checkpoint --target DIR|s3://bucket/prefix`"


def parse_state_dicts(text: str) -> list[str]:
    items = [part.strip() for part in str(text).split(",") if part.strip()]
    bad = [item for item in items if item not in STATE_DICTS]
    if not items or bad:
        raise UsageError(f"invalid --state-dict {text!r}: expected sharded, full or both (a comma list), "
                         f"e.g. --state-dict full,sharded")
    return list(dict.fromkeys(items))


def save_format(state_dict: str, text: str | None) -> str:
    """The format a state dict is written in: dcp for sharded; torch (default) or safetensors
    for full."""
    if text is not None and text not in SAVE_FORMATS:
        raise UsageError(f"invalid --save-format {text!r}: expected one of {', '.join(SAVE_FORMATS)}, "
                         f"e.g. --save-format torch")
    if state_dict == "sharded":
        return "dcp"
    if text == "dcp":
        raise UsageError("invalid --save-format 'dcp' with --state-dict full: a full state dict is written by one "
                         "process with torch.save or safetensors; e.g. --save-format torch")
    return text or "torch"


def serialize_from_record(record: dict[str, Any], source: str) -> tuple[float, str]:
    """(GB/s, source) of one process's serialize+write from a `checkpoint --state-dict full`
    record's save row."""
    probe = ((record.get("config") or {}).get("probe") or {})
    if record.get("kind") != "checkpoint" or probe.get("state_dict") != "full":
        raise UsageError(f"--serialize-rate {source!r} is a {record.get('kind')!r} record "
                         f"{'of a sharded save ' if record.get('kind') == 'checkpoint' else ''}; expected a rate "
                         f"(e.g. 2GB/s) or a record of `microbench checkpoint --state-dict full`")
    for row in record.get("rows") or []:
        part = row.get("serialize_write_time_us")
        if row.get("op") == "save" and isinstance(part, (int, float)) and part > 0 and row.get("size_bytes"):
            gbps = row["size_bytes"] / (part * 1e-6) / 1e9
            return gbps, (f"measured: {source} (torch.save {probe.get('save_format', 'torch')} of "
                          f"{row['size_bytes'] / 1e9:.2f} GB in {part / 1e6:.3f} s)")
    raise UsageError(f"--serialize-rate {source!r} has no save row with serialize_write_time_us; re-run "
                     f"`microbench checkpoint --state-dict full`")


@dataclass(frozen=True)
class SavePrediction:
    tier: str
    state_dict: str
    save_format: str
    total_bytes: float
    save_s: float
    gather_s: float | None = None          # full: the AllGathers
    offload_s: float | None = None         # full, from GPUs: rank 0's device-to-host copy
    write_s: float | None = None           # full: serialize + write + fsync, one process
    write_gbps: float | None = None        # the rate that bounded the write (full) or the aggregate (sharded)
    bounded_by: str = ""
    host_bytes: float | None = None        # full: host memory on rank 0's node
    host_fits: bool | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def sharded_save(tier: str, total_bytes: float, write_gbps: float) -> SavePrediction:
    return SavePrediction(tier, "sharded", "dcp", total_bytes, total_bytes / (write_gbps * 1e9),
                          write_gbps=write_gbps, bounded_by="the tier's aggregate write bandwidth, every rank at once")


def gather_s(total_bytes: float, unit_bytes: float, ranks: int, curve: Any) -> float:
    """One AllGather per unit-sized piece of the state (nccl-tests size: the gathered tensor)."""
    if ranks <= 1:
        return 0.0
    count = max(1, math.ceil(total_bytes / max(unit_bytes, 1.0)))
    return count * curve.time_s(total_bytes / count, ranks)[0]


def full_save(tier: str, total_bytes: float, *, gather_time_s: float, host_link_gbps: float | None,
              serialize_gbps: float, stream_gbps: float | None, aggregate_gbps: float, nodes: int,
              aggregate_is_job: bool, fmt: str = "torch", host_memory_bytes: float | None = None) -> SavePrediction:
    """The full save's parts; `stream_gbps` None: unknown, one node's share of the aggregate is used."""
    for name, value in (("serialize rate", serialize_gbps), ("aggregate write", aggregate_gbps)):
        if not (value > 0 and math.isfinite(value)):
            raise UsageError(f"tier {tier!r}: {name} {value!r} GB/s; expected a positive finite number")
    share = aggregate_gbps / max(nodes, 1) if aggregate_is_job else aggregate_gbps
    stream = min(stream_gbps, share) if stream_gbps else share
    rate = min(serialize_gbps, stream)
    if rate == serialize_gbps and serialize_gbps < stream:
        bounded = "one process's serialization"
    elif stream_gbps and stream_gbps <= share:
        bounded = "the tier's single stream"
    else:
        bounded = "one node's share of the tier" if aggregate_is_job else "the tier's measured bandwidth"
    offload = total_bytes / (host_link_gbps * 1e9) if host_link_gbps else 0.0
    write = total_bytes / (rate * 1e9)
    host = total_bytes * (2 if fmt == "safetensors" else 1)
    fits = None if host_memory_bytes is None else host <= host_memory_bytes
    return SavePrediction(tier, "full", fmt, total_bytes, gather_time_s + offload + write, gather_time_s,
                          offload if host_link_gbps else None, write, rate, bounded, host, fits)


def notes(tiers: list[Any], state_dicts: list[str], serialize_source: str,
          host_memory_bytes: float | None, preds: list[SavePrediction]) -> list[str]:
    """The lines under the table: where the rates came from and what was assumed."""
    out = []
    if "full" in state_dicts:
        out.append(f"full save: serialization {serialize_source}")
        for t in tiers:
            if not t.stream_gbps:
                out.append(f"{t.name}: single-stream write not given: assumed one node's share of its aggregate; "
                           f"on shared filesystems and object stores one stream usually gets far less: measure it "
                           f"with {MEASURE_STREAM}, or give --tier {t.name}=W:R,stream=GB/S")
        full = [p for p in preds if p.state_dict == "full" and p.host_bytes]
        if full and host_memory_bytes is None:
            out.append(f"rank 0's node needs {max(p.host_bytes or 0 for p in full) / 1e9:,.1f} GB of free host memory "
                       f"for the whole state; give --host-memory to check it")
        for p in full:
            if p.host_fits is False:   # judged from both: neither is None here
                assert p.host_bytes is not None and host_memory_bytes is not None
                out.append(f"DOES NOT FIT: a full {p.save_format} save on {p.tier} needs {p.host_bytes / 1e9:,.1f} GB "
                           f"of host memory on rank 0's node, {host_memory_bytes / 1e9:,.1f} GB given "
                           f"(--host-memory); use --state-dict sharded")
    for t in tiers:
        if t.rated_only:
            out.append(f"{t.name}: described only by its rated aggregate bandwidth; a DCP save from GPUs "
                       f"usually reaches far less of it: measure it with {MEASURE_DCP}")
    return out


def predict_saves(tiers: list[Any], state_dicts: list[str], fmt_text: str | None, total_bytes: float, *,
                  unit_bytes: float, ranks: int, nodes: int, curve: Any, host_link_gbps: float | None,
                  serialize_gbps: float, host_memory_bytes: float | None = None) -> list[SavePrediction]:
    """Every tier's save for every state dict asked for, tier by tier."""
    fmts = {sd: save_format(sd, fmt_text) for sd in state_dicts}
    gathered = gather_s(total_bytes, unit_bytes, ranks, curve) if "full" in state_dicts else 0.0
    out = []
    for t in tiers:
        for sd in state_dicts:
            if sd == "sharded":
                out.append(sharded_save(t.name, total_bytes, t.write_gbps))
            else:
                out.append(full_save(t.name, total_bytes, gather_time_s=gathered, host_link_gbps=host_link_gbps,
                                     serialize_gbps=serialize_gbps, stream_gbps=t.stream_gbps,
                                     aggregate_gbps=t.write_gbps, nodes=nodes,
                                     aggregate_is_job=t.aggregate_is_job, fmt=fmts[sd],
                                     host_memory_bytes=host_memory_bytes))
    return out


def save_table(preds: list[SavePrediction], fmt_time: Any) -> tuple[list[str], list[tuple[str, ...]]]:
    """(headers, rows) of the saves: the full save's parts beside its total."""
    def t(value: float | None) -> str:
        return "-" if value is None else fmt_time(value)

    rows: list[tuple[str, ...]]
    rows = [(p.tier, p.state_dict, p.save_format, t(p.save_s), t(p.gather_s), t(p.offload_s), t(p.write_s),
             f"{p.write_gbps:,.2f} GB/s" if p.write_gbps else "-", p.bounded_by,
             "-" if p.host_bytes is None else f"{p.host_bytes / 1e9:,.1f} GB"
             + ("" if p.host_fits is None else " (fits)" if p.host_fits else " DOES NOT FIT"))
            for p in preds]
    return ["tier", "state dict", "format", "save", "gather", "to host", "serialize+write", "write rate",
            "bounded by", "rank 0 host memory"], rows
