"""`microbench compose`: predicted FSDP2 step time, memory per GPU and checkpoint time per
storage tier, for one model over one or more networks and tiers (the what-if tables), from
saved records or described hardware. A thin printer over microbench/compose/."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any

from tabulate import tabulate

from .. import compose as cp
from ..compose.dataload import loading_report
from ..compose.hardware import RESERVED_MEMORY_FRACTION
from ..compose.checkpoint import mount as mount_tier
from ..core.units import DTYPE_BYTES
from ..compose.model import format_params
from ..compose.report import format_bytes, format_rate, format_time, with_ratios
from ..results.outputs import check_new_file
from ..results import RecordWriter, load_record, write_csv
from ..compose.job import report as job_report
from ..compose import inputs, whatif
from ..compose.checkpoint import full as fs
from ..compose.inputs import DEFAULT_MFU
from ..compose.sharding import inputs as sharding_inputs
from . import compose_sharding


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("compose", help="predict FSDP2 step time, memory per GPU and checkpoint time per tier",
                       description="Predict an FSDP2 training step (compute, AllGather, ReduceScatter, optimizer, "
                                   "overlap) and checkpoint times from a model's shapes, a GPU and networks and "
                                   "storage tiers, measured (records) or described (--net, --tier). Several "
                                   "--net/--nccl and --tier/--storage give what-if tables side by side.")
    m = p.add_argument_group("model")
    m.add_argument("--model", default="llama-3.1-8b",
                   help=f"a preset with real shapes: {', '.join(cp.PRESETS)} (default llama-3.1-8b)")
    m.add_argument("--model-config", metavar="FILE", help="a Hugging Face config.json or its model directory (text_config inside is "
                   "read too); read from disk, no network")
    m.add_argument("--params", help="crude escape hatch: total parameters, e.g. 7e9 (with --layers)")
    m.add_argument("--layers", help="crude escape hatch: blocks (FSDP units), e.g. 32 (with --params)")
    t = p.add_argument_group("training")
    t.add_argument("--nodes", help="nodes (default 1 with --gpus-per-node)")
    t.add_argument("--gpus-per-node", help="ranks per node (default 8 with --nodes)")
    t.add_argument("--ranks", help="world size, instead of --nodes x --gpus-per-node (default: the record's)")
    t.add_argument("--micro-batch", default="1", help="sequences per rank per micro-batch (default 1)")
    t.add_argument("--seq-len", default="4096", help="tokens per sequence (default 4096)")
    t.add_argument("--grad-accum", default="1", help="micro-batches per optimizer step (default 1)")
    t.add_argument("--param-dtype", default="bfloat16", choices=sorted(cp.fsdp.DTYPE_BYTES),
                   help="what AllGather moves and compute uses (default bfloat16)")
    t.add_argument("--reduce-dtype", default=None, choices=sorted(cp.fsdp.DTYPE_BYTES),
                   help="what ReduceScatter moves (default bfloat16, as FSDP2 mixed precision is usually set; "
                        "float32 when predicting a CPU: a --compute record timed on a CPU and no --gpu)")
    t.add_argument("--activation-checkpointing", action="store_true", help="recompute each block's forward in "
                   "backward (more FLOPs, far less activation memory)")
    t.add_argument("--no-reshard-after-forward", action="store_true", help="keep blocks gathered from forward "
                   "to backward (no second AllGather, more memory)")
    c = p.add_argument_group("compute (optimizer: AdamW)")
    c.add_argument("--gpu", help=f"accelerator: {', '.join(cp.GPUS)} (peak dense bf16, memory size and "
                   f"bandwidth for the memory check and the optimizer step)")
    c.add_argument("--mfu", default=str(DEFAULT_MFU), help=f"achieved fraction of --gpu's peak (default {DEFAULT_MFU})")
    c.add_argument("--tflops", help="achieved TFLOP/s per rank, instead of --gpu x --mfu, e.g. 400")
    c.add_argument("--compute", metavar="RECORD", help="a `microbench compute` record: the rate measured for "
                   "the model's matmuls on a device (overrides --tflops and --mfu)")
    c.add_argument("--overlap", help="fraction of communication that can run beside compute, 0..1 (default 1 on "
                   "GPUs, where NCCL runs beside compute; 0 when predicting a CPU, where gloo competes for the "
                   "cores; or the --calibration's)")
    c.add_argument("--unit-overhead", metavar="DURATION", help="FSDP's own cost per unit per pass (copy-in/out, "
                   "hooks), never hidden, e.g. 200us (default 0, or the calibration's)")
    c.add_argument("--calibration", metavar="RECORD", help="a `microbench verify --calibrate-only` record: its "
                   "measured overlap and per-unit overhead (flags given here win)")
    n = p.add_argument_group("network (one or more; several give a what-if table)")
    n.add_argument("--nccl", action="append", default=[], metavar="[NAME=]RECORD",
                   help="a `microbench nccl` record with all_gather and reduce_scatter rows (or a suite directory), e.g. "
                        "results/suite-*/collectives.json; at another world size it is rescaled (repeatable)")
    n.add_argument("--net", action="append", default=[], metavar="NAME=BUSBW[@LATENCY]",
                   help="a described network: the bus bandwidth (nccl-tests busbw) the job's collectives reach, "
                        "with units, and the per-collective latency (default 0), e.g. --net ib=40GB/s@30us")
    n.add_argument("--allow-partial", action="store_true", help="accept records whose run did not finish")
    compose_sharding.add_arguments(p)   # issue 24: --net-intra, --net-inter, --sharding, --scale-nodes
    s = p.add_argument_group("checkpoint")
    s.add_argument("--tier", action="append", default=[], metavar="NAME=WRITE[:READ]",
                   help="a storage tier by the aggregate GB/s the job gets, e.g. --tier nvme=6:12; ,ephemeral: not "
                        "durable (a node-local disk); a bucket mount adds ,direct or ,cached,drain=GB/S[,delay=5s], "
                        "or ,cached alone: WRITE:READ are the bucket's, the cache is cache=GB/S or the fastest "
                        "ephemeral tier (repeatable)")
    s.add_argument("--storage", action="append", default=[], metavar="[NAME=]RECORD",
                   help="a storage or checkpoint record as a tier (its best write and read), e.g. "
                        "results/suite-*/storage-posix.json (repeatable)")
    s.add_argument("--state-dict", default="sharded", help="sharded (a DCP save, every rank at once), full (gathered "
                   "to rank 0, one process writes: Accelerate/Trainer's FULL_STATE_DICT) or full,sharded (default sharded)")
    s.add_argument("--save-format", default=None, help="dcp (sharded), torch or safetensors (full; default torch)")
    s.add_argument("--serialize-rate", metavar="GB/S|RECORD", help="one process's torch.save rate, or a "
                   "`checkpoint --state-dict full` record (default 2 GB/s, assumed)")
    s.add_argument("--host-memory", metavar="SIZE", help="host memory free on rank 0's node, for a full save, e.g. 1T")
    s.add_argument("--mtbf-hours", help="the job's mean time between failures, for the Young/Daly interval, e.g. 24")
    s.add_argument("--ckpt-interval", default="30min", help="checkpoint interval for the bandwidth needed, and "
                   "the job's (--steps) without --ckpt-every (default 30min)")
    s.add_argument("--ckpt-overhead", default="5%", help="share of time a blocking save may cost (default 5%%)")
    # issue 21: data loading and model loading (compose/dataload.py)
    d = p.add_argument_group("data and model loading")
    d.add_argument("--dataload", action="append", default=[], metavar="[NAME=]RECORD",
                   help="a `microbench dataload` record: the loader's rate per rank (repeatable)")
    d.add_argument("--data-rate", action="append", default=[], metavar="NAME=SAMPLES/S",
                   help="a described loader rate per rank, prefetching, e.g. --data-rate s3=900 (repeatable)")
    d.add_argument("--sample-bytes", metavar="SIZE", help="bytes per training sample (default: the record's)")
    d.add_argument("--modelload", action="append", default=[], metavar="[NAME=]RECORD",
                   help="a `microbench modelload` record: model load time at start and each restart (repeatable); "
                        "every --tier/--storage with a read rate gives one too")
    # issue 23: the whole job over every storage assignment (compose/job/report.py)
    j = p.add_argument_group("the whole job (a timeline, the what-if per storage assignment, a recommendation)")
    j.add_argument("--steps", help="train this many optimizer steps, e.g. 80 (asks for the job)")
    j.add_argument("--tokens", help="or train this many tokens, e.g. 1e9 (steps rounded up)")
    j.add_argument("--ckpt-every", metavar="K", help="a checkpoint every K steps (default: from --ckpt-interval)")
    j.add_argument("--async-ckpt", action="store_true", help="async DCP saves: the staging copy blocks, the write drains")
    for flag, phase in (("--data", "batches"), ("--model-from", "the model at start and after a restart"),
                        ("--ckpt-to", "checkpoints")):
        j.add_argument(flag, metavar="TIER[,TIER]", help=f"where {phase} come from/go to: tier names, a comma list "
                       f"(default: every tier the inputs allow)")
    o = p.add_argument_group("output")
    o.add_argument("--json", metavar="PATH", help="write the compose record here (default: results/compose-TIME.json)")
    o.add_argument("--csv", metavar="PATH", help="also write the predictions as CSV rows")
    o.add_argument("--results-dir", default="results", metavar="DIR", help="where the record goes without --json")
    p.set_defaults(handler=run)


def _refuse_existing(args: argparse.Namespace) -> None:
    for flag, path in (("--json", args.json), ("--csv", args.csv)):
        if path:
            check_new_file(path, flag, noun=flag, kept="results", parents_made=flag == "--json")


def _print_saves(req: inputs.ComposeRequest, given: inputs.ComposeInputs, result: Any) -> None:
    """Saves as trainers write them (issue 25): a full state dict gathered to rank 0 beside the
    sharded save, per tier; the record keeps them as `save` rows."""
    nets, rate = given.networks, given.rate
    saves = fs.predict_saves(given.tiers, given.state_dicts, req.save_format, result.checkpoint_bytes,
                             unit_bytes=4.0 * given.model.block_params, ranks=given.world, nodes=given.nodes or 1,
                             curve=nets[0].all_gather, serialize_gbps=given.serialize_gbps,
                             host_link_gbps=rate.gpu.host_link_gbps if rate.gpu else None,
                             host_memory_bytes=given.host_memory_bytes)
    if "full" in given.state_dicts:   # a sharded save alone is the table above
        headers, rows = fs.save_table(saves, format_time)
        print(f"\n## saves per tier: {', '.join(given.state_dicts)} (full: gathered over {nets[0].name})")
        print(tabulate(rows, headers=headers, tablefmt="simple", disable_numparse=True))
        result.tiers = result.tiers + saves
    for line in fs.notes(given.tiers, given.state_dicts, given.serialize_source, given.host_memory_bytes, saves):
        print(f"# {line}")


def request(args: argparse.Namespace) -> inputs.ComposeRequest:
    return inputs.ComposeRequest(**{f.name: getattr(args, f.name) for f in dataclasses.fields(inputs.ComposeRequest)})


def run(args: argparse.Namespace) -> int:
    _refuse_existing(args)
    req = request(args)
    given = inputs.build(req)
    plan = sharding_inputs.plan(req.sharding, req.scale_nodes, given.networks, given.world, given.nodes)  # issue 24
    result = whatif.compose(given)
    job = job_report.run(req, given, result, load_record)   # issue 23: the whole job (--steps): refused before output
    model, rate, nets, cal = given.model, given.rate, given.networks, given.calibration

    _print_header(model, given.train, given.world, given.nodes, rate)
    if cal is not None:
        print(f"# calibration: {cal.source} (overlap {cal.overlap}, unit overhead "
              f"{format_time(cal.unit_overhead_s)}, measured on {cal.backend or 'an unnamed backend'})")
        backends = {n.backend for n in nets if n.backend != "synthetic"}
        if cal.backend and backends and backends != {cal.backend}:
            print(f"# warning: the calibration was measured on {cal.backend}; the networks are {', '.join(sorted(backends))}")
    _print_memory(result.memory, rate)
    _print_steps(nets, result.steps, result.memory)
    if plan is not None:   # issue 24: the sharding what-ifs, their rows into the record
        result.extra_rows += compose_sharding.print_sharding(given, plan)
    if given.tiers:
        _print_checkpoint(result.parts, result.tiers, result.checkpoint_bytes, given.interval_s, given.overhead,
                          given.mtbf_s, rate)
        print("\n".join(mount_tier.report_lines(given.tiers, result.checkpoint_bytes, given.interval_s,
                                                given.overhead)))
        print("\n".join(f"# {t['note']}" for t in given.tiers if t.get("note")))   # issue 23: cached, no drain=
        _print_saves(req, given, result)
    elif given.mtbf_s:
        print("\n# no --tier or --storage: the Young/Daly interval needs a save time")
    train = given.train
    loading = loading_report(req, model.total_params * DTYPE_BYTES[train.param_dtype],   # issue 21
                             train.micro_batch * train.grad_accum,
                             {n.name: result.steps[n.name].step_s for n in nets}, given.tiers, given.mtbf_s, format_time)
    record = whatif.record(result, loading)
    if job is not None:
        print("\n".join(job[0]))
        record["summary"]["job"], record["rows"] = job[1]["summary"], record["rows"] + job[1]["rows"]
    path = RecordWriter(record, args.json, directory=args.results_dir).finish("complete")
    if args.csv:
        write_csv(args.csv, record["rows"])
    sys.stdout.flush()
    print(f"\n# record: {path}")
    return 0


def _print_header(model: Any, train: cp.TrainSpec, world: int, nodes: int | None, rate: inputs.ComputeRate) -> None:
    units = f"{model.layers} blocks of {format_params(model.block_params)}"
    if model.root_params:
        units += f" + root {format_params(model.root_params)}"
    moe = f", {model.experts} experts top-{model.top_k}" if model.experts > 1 else ""
    print(f"# model {model.name} ({model.source}): {format_params(model.total_params)} params, "
          f"{format_params(model.active_params)} active{moe}; FSDP units: {units}")
    layout = f" ({nodes} nodes x {world // nodes})" if nodes else ""
    print(f"# training: {world} ranks{layout}, micro-batch {train.micro_batch} x {train.seq_len} tokens, "
          f"grad-accum {train.grad_accum}, AllGather {train.param_dtype}, ReduceScatter {train.reduce_dtype}, "
          f"{'reshard after forward' if train.reshard_after_forward else 'no reshard after forward'}, "
          f"activation checkpointing {'on' if train.activation_checkpointing else 'off'}, AdamW, "
          f"overlap {train.overlap:g}, FSDP overhead {format_time(train.unit_overhead_s)} per unit per pass")
    tflops = rate.flops_per_rank / 1e12
    print(f"# compute: {tflops:,.1f}" if tflops >= 10 else f"# compute: {tflops:.3g}", end="")
    print(f" TFLOP/s per rank ({rate.source})")
    if rate.warning:
        print(f"# warning: {rate.warning}")
    if rate.measured_model and rate.measured_model != model.name:
        print(f"# warning: the compute record timed {rate.measured_model}'s shapes, not {model.name}'s")


def _print_memory(memory: cp.MemoryCheck, rate: inputs.ComputeRate) -> None:
    rows = [("sharded params, grads, AdamW (fp32)", format_bytes(memory.sharded_state_bytes)),
            ("gathered units in flight + their grads", format_bytes(memory.gathered_bytes))]
    if memory.activation_bytes is None:
        rows.append(("activations", "unknown (--params/--layers has no shapes)"))
    else:
        rows.append(("activations, no checkpointing", format_bytes(memory.activation_bytes_no_ac)))
        rows.append(("activations, with checkpointing", format_bytes(memory.activation_bytes_ac)))
    rows.append(("total (chosen setting)", format_bytes(memory.total_bytes)))
    print("\n## memory per GPU")
    print(tabulate(rows, headers=["part", "bytes"], tablefmt="simple", disable_numparse=True))
    if memory.fits is None:
        print("# memory check: no --gpu, so no capacity to check against")
    elif memory.fits:
        print(f"# fits: {format_bytes(memory.total_bytes)} of {format_bytes(memory.capacity_bytes)} usable on "
              f"{rate.gpu.name} ({RESERVED_MEMORY_FRACTION:.0%} kept for CUDA context, NCCL, fragmentation)")
    else:
        print(f"# DOES NOT FIT: {format_bytes(memory.total_bytes)} needed per GPU, {format_bytes(memory.capacity_bytes)} "
              f"usable on {rate.gpu.name}; more ranks, activation checkpointing or a smaller micro-batch")


_PARTS = (("compute forward", "compute_fwd_s"), ("compute backward", "compute_bwd_s"),
          ("AllGather forward", "allgather_fwd_s"), ("AllGather backward", "allgather_bwd_s"),
          ("ReduceScatter", "reduce_scatter_s"), ("optimizer step", "optimizer_s"), ("FSDP overhead", "fsdp_overhead_s"),
          ("exposed communication", "exposed_comm_s"), ("step (overlapped)", "step_s"),
          ("bound: no overlap", "no_overlap_s"), ("bound: full overlap", "full_overlap_s"))


def _print_steps(nets: list[cp.Network], preds: dict[str, cp.StepPrediction], memory: cp.MemoryCheck) -> None:
    print("\n## step time per network" + ("  [DOES NOT FIT in memory: times are for reference]"
                                           if memory.fits is False else ""))
    table = [[label] + [format_time(getattr(preds[n.name], key)) for n in nets] for label, key in _PARTS]
    if not any(preds[n.name].optimizer_s for n in nets):
        table[5] = ["optimizer step"] + ["not estimated (no --gpu)"] * len(nets)
    print(tabulate(table, headers=["part"] + [n.name for n in nets], tablefmt="simple", disable_numparse=True))
    rows = with_ratios([{"network": n.name, "step_s": preds[n.name].step_s} for n in nets], "step_s")
    print("\n## what-if: network x step")
    print(tabulate([(r["network"], format_time(r["step_s"]), f"{preds[r['network']].tokens_per_s:,.0f}",
                     format_time(preds[r["network"]].exposed_comm_s), f"{r['ratio']:.2f}x",
                     format_rate(preds[r["network"]].breakeven_busbw_gbps)) for r in rows],
                   headers=["network", "step", "tokens/s", "exposed comm", "vs best", "compute-bound above busbw"],
                   tablefmt="simple", disable_numparse=True))
    for net in nets:
        how: dict[str, list[str]] = {}
        for note in preds[net.name].notes:
            op, _, text = note.partition(" ")
            how.setdefault(text, []).append(op)
        for text, ops in how.items():
            print(f"# {net.name}: {' and '.join(ops)} {text}")
        for warning in net.warnings:
            print(f"# warning: {warning}")


def _print_checkpoint(parts: dict[str, float], tier_preds: list[Any], ckpt_bytes: float, interval_s: float,
                      overhead: float, mtbf_s: float | None, rate: inputs.ComputeRate) -> None:
    print(f"\n## checkpoint: {format_bytes(ckpt_bytes)} (fp32 master weights {format_bytes(parts['master_weights_bytes'])}"
          f" + AdamW state {format_bytes(parts['optimizer_state_bytes'])}); weights alone "
          f"{format_bytes(parts['weights_bytes'])}")
    rows = with_ratios([t.as_dict() for t in tier_preds], "save_s")
    print(tabulate([(r["tier"], format_rate(r["write_gbps"]), format_rate(r["read_gbps"]), format_time(r["save_s"]),
                     format_time(r["load_s"]), format_time(r["async_blocked_s"]),
                     format_time(r["young_daly_interval_s"]), f"{r['ratio']:.2f}x") for r in rows],
                   headers=["tier", "write", "read", "save", "load", "blocked (async)", "Young/Daly interval",
                            "vs best"], tablefmt="simple", disable_numparse=True))
    need_block = cp.required_write_gbps(ckpt_bytes, interval_s, overhead)
    print(f"# a checkpoint every {format_time(interval_s)} at {overhead:.0%} overhead needs {format_rate(need_block)} "
          f"of write bandwidth with a blocking save; an async save needs {format_rate(ckpt_bytes / interval_s / 1e9)} "
          f"(to drain within the interval)")
    if rate.gpu is None:
        print("# async blocked time needs --gpu (the host link the staging copy crosses)")
    if mtbf_s is None:
        print("# Young/Daly interval: give --mtbf-hours")
