"""`microbench compose`: predicted FSDP step and checkpoint times from saved records."""

from __future__ import annotations

import argparse

from tabulate import tabulate

from .. import compose as cp
from ..errors import UsageError
from ..env import collect
from ..results import RecordWriter, load_record, new_record
from ..sizes import parse_positive_int


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("compose", help="predict FSDP step time and checkpoint time per tier from measured records")
    p.add_argument("--nccl", required=True, metavar="RECORD", help="a `microbench nccl` record with all_gather and reduce_scatter rows")
    p.add_argument("--model", default="llama-8b", help=f"preset ({', '.join(cp.PRESETS)}) unless --params/--layers are given")
    p.add_argument("--params", default=None, help="total parameters, e.g. 7e9")
    p.add_argument("--layers", default=None, help="transformer blocks (FSDP units), e.g. 32")
    p.add_argument("--ranks", default=None, help="world size to predict for (default: the record's)")
    p.add_argument("--tokens", default="4096", help="tokens per rank per micro-batch (default 4096)")
    p.add_argument("--tflops", default="400", help="achieved TFLOP/s per rank (default 400, an H100 in bf16 at ~40%% MFU)")
    p.add_argument("--grad-accum", default="1", help="micro-batches per step (default 1)")
    p.add_argument("--activation-checkpointing", action="store_true")
    p.add_argument("--tier", action="append", default=[], metavar="NAME=WRITE_GBPS[:READ_GBPS]",
                   help="a storage tier for the checkpoint estimate, e.g. --tier nvme=6:12 (repeatable)")
    p.add_argument("--storage", action="append", default=[], metavar="[NAME=]RECORD",
                   help="a storage/checkpoint record as a tier (best write and read it measured); repeatable")
    p.add_argument("--mtbf-hours", default=None, help="mean time between failures, for the Young/Daly interval")
    p.add_argument("--json", default=None, metavar="PATH",
                   help="also write the prediction as a record (kind compose), e.g. for `microbench report`")
    p.set_defaults(handler=run)


def _float(text: str, what: str, example: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"invalid {what} {text!r}: expected a number, e.g. {what} {example}") from None
    if value <= 0:
        raise UsageError(f"invalid {what} {text!r}: must be positive, e.g. {what} {example}")
    return value


def _model(args: argparse.Namespace) -> cp.ModelSpec:
    if args.params or args.layers:
        if not (args.params and args.layers):
            raise UsageError("--params and --layers go together, e.g. --params 7e9 --layers 32")
        return cp.ModelSpec("custom", _float(args.params, "--params", "7e9"),
                            parse_positive_int(args.layers, what="--layers", example="32"))
    if args.model not in cp.PRESETS:
        raise UsageError(f"invalid --model {args.model!r}: expected one of {', '.join(cp.PRESETS)}, "
                         f"or --params/--layers")
    return cp.PRESETS[args.model]


def _tier(text: str) -> tuple[str, float, float | None]:
    name, _, rates = text.partition("=")
    write, _, read = rates.partition(":")
    if not name or not write:
        raise UsageError(f"invalid --tier {text!r}: expected NAME=WRITE_GBPS[:READ_GBPS], e.g. nvme=6:12")
    return name, _float(write, "--tier write GB/s", "nvme=6"), _float(read, "--tier read GB/s", "nvme=6:12") if read else None


def _tier_from_record(text: str) -> tuple[str, float, float | None]:
    from ..compose.tiers import tier_bandwidths

    name, sep, path = text.partition("=")
    if not sep:
        name, path = "", text
    record = load_record(path)
    write, read = tier_bandwidths(record, path)
    return name or str(record.get("kind")), write, read


def run(args: argparse.Namespace) -> int:
    record = load_record(args.nccl)
    ag = cp.Curve.from_record(record, "all_gather", args.nccl)
    rs = cp.Curve.from_record(record, "reduce_scatter", args.nccl)
    model = _model(args)
    ranks = parse_positive_int(args.ranks, what="--ranks", example="8") if args.ranks else ag.ranks
    train = cp.TrainSpec(ranks=ranks, tokens_per_rank=parse_positive_int(args.tokens, what="--tokens", example="4096"),
                         flops_per_rank=_float(args.tflops, "--tflops", "400") * 1e12,
                         grad_accum=parse_positive_int(args.grad_accum, what="--grad-accum", example="4"),
                         activation_checkpointing=args.activation_checkpointing)
    p = cp.predict_step(model, train, ag, rs)
    print(f"# FSDP step: {model.name} ({model.params / 1e9:.2f} B params, {model.layers} units), {ranks} ranks, "
          f"{train.tokens_per_rank} tokens/rank/micro-batch x {train.grad_accum}, {args.tflops} TFLOP/s per rank")
    rows = [("compute", p.compute_s), ("allgather fwd", p.allgather_fwd_s), ("allgather bwd", p.allgather_bwd_s),
            ("reduce-scatter", p.reduce_scatter_s), ("step (overlapped)", p.step_s),
            ("bound: no overlap", p.no_overlap_s), ("bound: full overlap", p.full_overlap_s),
            ("exposed communication", p.exposed_comm_s)]
    print(tabulate([(k, f"{v * 1e3:.1f}") for k, v in rows], headers=["component", "ms"], tablefmt="simple"))
    for note in p.notes:
        print(f"# {note}")
    tiers = [_tier(text) for text in args.tier] + [_tier_from_record(text) for text in args.storage]
    record_rows = [{"probe": "compose", "op": "step", "component": k, "time_ms": v * 1e3} for k, v in rows]
    if tiers:
        total = cp.checkpoint_bytes(cp.CheckpointSpec(params=model.params))
        mtbf = _float(args.mtbf_hours, "--mtbf-hours", "24") * 3600 if args.mtbf_hours else None
        print(f"\n# checkpoint: {total / 1e9:.1f} GB (fp32 master + AdamW moments)")
        table = []
        for name, write, read in tiers:
            t = cp.predict_tier(name, total, write, read, mtbf_s=mtbf)
            record_rows.append({"probe": "compose", "op": "checkpoint", "tier": name, "checkpoint_bytes": total,
                                **t.as_dict()})
            table.append((name, f"{write:.2f}", f"{t.save_s:.1f}", f"{t.load_s:.1f}" if t.load_s else "-",
                          f"{t.young_daly_interval_s / 60:.0f}" if t.young_daly_interval_s else "-"))
        print(tabulate(table, headers=["tier", "write GB/s", "save s", "load s", "interval min"], tablefmt="simple"))
    if args.json:
        _write_record(args, model, train, p, record_rows)
    return 0


def _write_record(args: argparse.Namespace, model: cp.ModelSpec, train: cp.TrainSpec, p: cp.StepPrediction,
                  rows: list[dict]) -> None:
    """A prediction is not a measurement, but it is a result someone will want to read back."""
    from dataclasses import asdict

    config = {"model": asdict(model), "train": asdict(train), "nccl_record": args.nccl,
              "storage_records": args.storage, "tiers": args.tier, "mtbf_hours": args.mtbf_hours}
    writer = RecordWriter(new_record("compose", config, collect(with_nics=False),
                                     {"engine": "microbench.compose (analytic model over measured curves)"}),
                          args.json)
    writer.record["summary"] = {"step": p.as_dict()}
    writer.add_rows(rows)
    print(f"# record: {writer.finish('complete')}")
