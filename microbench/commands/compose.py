"""`microbench compose`: predicted FSDP2 step time, memory per GPU and checkpoint time per
storage tier, for one model over one or more networks and tiers (the what-if tables), from
saved records or described hardware. The flags are compose/inputs/sections.py's; this parses
them, builds the typed inputs, calls the composer once (compose/whatif.py) and prints."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from tabulate import tabulate

from .. import compose as cp
from ..compose import inputs, kernels, whatif
from ..compose.checkpoint import full as fs, mount as mount_tier
from ..compose.dataload import report_lines as loading_lines
from ..compose.hardware import RESERVED_MEMORY_FRACTION
from ..compose.inputs.sections import ComposeOptions, Output
from ..compose.model import format_params
from ..compose.report import format_bytes, format_rate, format_time, with_ratios
from ..compose.sharding import whatif as sw
from ..core import sections
from ..results import RecordWriter, write_csv
from ..results.outputs import check_new_file


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("compose", help="predict FSDP2 step time, memory per GPU and checkpoint time per tier",
                       description="Predict an FSDP2 training step (compute, AllGather, ReduceScatter, optimizer, "
                                   "overlap) and checkpoint times from a model's shapes, a GPU and networks and "
                                   "storage tiers, measured (records) or described (--net, --tier). Several "
                                   "--net/--nccl and --tier/--storage give what-if tables side by side.")
    sections.add_sections(p, ComposeOptions)
    p.set_defaults(handler=run)


def _refuse_existing(output: Output) -> None:
    for flag, path in (("--json", output.json), ("--csv", output.csv)):
        if path:
            check_new_file(path, flag, noun=flag, kept="results", parents_made=flag == "--json")


def run(args: argparse.Namespace) -> int:
    output = sections.parse_section(Output, args)
    _refuse_existing(output)     # before anything else is read
    opts = sections.parse_sections(ComposeOptions, args)
    result = whatif.compose(inputs.build(opts))
    _print(result)
    record = whatif.record(result)
    path = RecordWriter(record, output.json, directory=output.results_dir).finish("complete")
    if output.csv:
        write_csv(output.csv, record["rows"])
    sys.stdout.flush()
    print(f"\n# record: {path}")
    return 0


def _print(result: whatif.Composition) -> None:
    given = result.inputs
    model, rate, nets, cal = given.model, given.rate, given.networks, given.calibration
    _print_header(model, given.train, given.world, given.nodes, rate, given.rates is not None)
    if given.assumed_network:
        print(f"# network: none named: assumed {given.assumed_network} (give --net-intra and --net-inter for yours)")
    if cal is not None and cal.measured is not None:
        m = cal.measured
        print(f"# calibration: {cal.source}: compute rates x {m.scale:.3g}, from a {m.measured_step_s:g} s step "
              f"measured on {m.gpu} ({', '.join(f'{k} {v}' for k, v in m.configuration.items() if v is not None)})")
    elif cal is not None:
        print(f"# calibration: {cal.source} (overlap {cal.overlap}, unit overhead "
              f"{format_time(cal.unit_overhead_s)}, measured on {cal.backend or 'an unnamed backend'})")
        backends = {n.backend for n in nets if n.backend != "synthetic"}
        if cal.backend and backends and backends != {cal.backend}:
            print(
                f"# warning: the calibration was measured on {cal.backend}; "
                f"the networks are {', '.join(sorted(backends))}"
            )
    _print_memory(result.memory, rate)
    _print_steps(nets, result.steps, result.memory)
    if given.rates is not None:
        scale_from = cal.source if cal is not None and cal.compute_scale else None
        print("\n".join(kernels.compute_lines(given.train, given.kernel_table, given.rates, format_time,
                                              model=model.name, measured=result.measured, scale_from=scale_from)))
    if given.sharding is not None:
        _print_sharding(result)
    if given.tiers:
        _print_checkpoint(result.parts, result.tiers, result.checkpoint_bytes, given.interval_s, given.overhead,
                          given.mtbf_s, rate)
        period = result.job.period() if result.job is not None else None
        print("\n".join(mount_tier.report_lines([t.mount for t in given.tiers if t.mount], result.checkpoint_bytes,
                                                given.interval_s, given.overhead, period)))
        print("\n".join(f"# {t.note}" for t in given.tiers if t.note))
        _print_saves(result)
    elif given.mtbf_s:
        print("\n# no --tier or --storage: the Young/Daly interval needs a save time")
    for line in loading_lines(result.loading.stalls, result.loading.loads, format_time):
        print(line)
    if result.job is not None:
        print("\n".join(result.job.lines(result.memory.fits)))


def _print_saves(result: whatif.Composition) -> None:
    """Saves as trainers write them: a full state dict gathered to rank 0 beside the sharded
    save, per tier; the record keeps them as `save` rows."""
    given = result.inputs
    if result.full_saves:   # a sharded save alone is the table above
        headers, rows = fs.save_table(result.saves, format_time)
        print(f"\n## saves per tier: {', '.join(given.state_dicts)} (full: gathered over {given.networks[0].name})")
        print(tabulate(rows, headers=headers, tablefmt="simple", disable_numparse=True))
    for line in fs.notes(given.tiers, given.state_dicts, given.serialize_source, given.host_memory_bytes, result.saves):
        print(f"# {line}")


def _print_sharding(result: whatif.Composition) -> None:
    """The sharding what-if: strategy x network at the job's nodes, and at other node counts."""
    given, plan = result.inputs, result.inputs.sharding
    assert plan is not None
    train, rows = given.train, result.sharding
    nodes = max(1, train.ranks // plan.ranks_per_node)
    layout = (f"{train.ranks} ranks" if given.nodes is None and plan.ranks_per_node == train.ranks
              else f"{nodes} node{'s' if nodes > 1 else ''} x {plan.ranks_per_node} ranks")
    print(f"\n## what-if: sharding x network ({layout})")
    print(tabulate(sw.table(rows, format_time, format_bytes), headers=sw.HEADERS, tablefmt="simple",
                   disable_numparse=True))
    for net in given.networks:
        if net.levels is not None:
            lv = net.levels
            print(f"# {net.name}: intra {format_rate(lv.intra_gbps('all_gather'))} busbw, one node to the others "
                  f"{format_rate(lv.node_inter_gbps('all_gather'))} ({lv.source})")
    for line in sw.memory_notes(rows, format_bytes) + sw.notes(rows):
        print(f"# {line}")
    print("# hybrid: AllGather and ReduceScatter inside the shard group; each unit's gradient shard all-reduced "
          "across the replicas once per step behind the last micro-batch's backward (FSDP2 HSDP, "
          "set_requires_all_reduce(False) on the others); ring collectives, each bound by the slower level "
          "(compose/levels.py)")
    if train.grad_accum == 1 and any(r.strategy.startswith("hybrid") for r in rows):
        print("# with --grad-accum K, full sharding crosses nodes K times per step, hybrid's all-reduce still once")
    if result.scaled:
        print(f"\n## what-if at other node counts ({plan.ranks_per_node} ranks per node)")
        print(tabulate(sw.table(result.scaled, format_time, format_bytes, with_nodes=True),
                       headers=["nodes", "ranks"] + sw.HEADERS, tablefmt="simple", disable_numparse=True))
        print(f"# method: {sw.SCALE_METHOD}")


def _print_header(model: Any, train: cp.TrainSpec, world: int, nodes: int | None, rate: inputs.ComputeRate,
                  per_kernel: bool) -> None:
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
          f"activation checkpointing {train.activation_checkpointing}, ReduceScatter "
          f"{'every micro-batch' if train.sync_every_microbatch else 'once, on the last micro-batch'}, AdamW, "
          f"overlap {train.overlap:g}, FSDP overhead {format_time(train.unit_overhead_s)} per unit per pass")
    if per_kernel:
        assert rate.gpu is not None   # kernels are priced on a named GPU only
        print(f"# compute: priced per kernel on {rate.gpu.name} (breakdown below the step table), "
              f"compute beside collectives at {1 - train.contention:.3g} of its rate")
        if rate.warning:
            print(f"# warning: {rate.warning}")
        return
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
        no_ac, ac = memory.activation_bytes_no_ac, memory.activation_bytes_ac
        assert no_ac is not None and ac is not None   # known with activation_bytes
        rows.append(("activations, no checkpointing", format_bytes(no_ac)))
        rows.append(("activations, with checkpointing", format_bytes(ac)))
    rows.append(("total (chosen setting)", format_bytes(memory.total_bytes)))
    print("\n## memory per GPU")
    print(tabulate(rows, headers=["part", "bytes"], tablefmt="simple", disable_numparse=True))
    if memory.fits is None:
        print("# memory check: no --gpu, so no capacity to check against")
        return
    assert memory.capacity_bytes is not None and rate.gpu is not None   # fits is judged on a named GPU
    if memory.fits:
        print(f"# fits: {format_bytes(memory.total_bytes)} of {format_bytes(memory.capacity_bytes)} usable on "
              f"{rate.gpu.name} ({RESERVED_MEMORY_FRACTION:.0%} kept for CUDA context, NCCL, fragmentation)")
    else:
        print(
            f"# DOES NOT FIT: {format_bytes(memory.total_bytes)} needed per GPU, {format_bytes(memory.capacity_bytes)} "
            f"usable on {rate.gpu.name}; more ranks, activation checkpointing or a smaller micro-batch"
        )


_PARTS = (
    ("compute forward", "compute_fwd_s"),
    ("compute backward", "compute_bwd_s"),
    ("AllGather forward", "allgather_fwd_s"),
    ("AllGather backward", "allgather_bwd_s"),
    ("ReduceScatter", "reduce_scatter_s"),
    ("optimizer step", "optimizer_s"),
    ("FSDP overhead", "fsdp_overhead_s"),
    ("exposed communication", "exposed_comm_s"),
    ("step (overlapped)", "step_s"),
    ("bound: no overlap", "no_overlap_s"),
    ("bound: full overlap", "full_overlap_s"),
)


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
    print(
        f"\n## checkpoint: {format_bytes(ckpt_bytes)} "
        f"(fp32 master weights {format_bytes(parts['master_weights_bytes'])}"
        f" + AdamW state {format_bytes(parts['optimizer_state_bytes'])}); weights alone "
        f"{format_bytes(parts['weights_bytes'])}"
    )
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
