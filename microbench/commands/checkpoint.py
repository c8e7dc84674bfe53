"""`microbench checkpoint`: real DCP save/load (and async save) of a sharded state dict."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
from typing import Any

from tabulate import tabulate

from ..world import backends
from ..run import provision as needs
from ..targets import checkpoint_target as ct
from ..world.launch import check_local_world, detect_world
from ..core.errors import RunError, UsageError
from ..probes import checkpoint as ck
from ..world.policy import free_memory_bytes, in_world, local_ranks
from ..core.units import format_size, memory_shortfall, parse_positive_int, parse_size
from ..run.runner import run_probe
from .common import add_sweep_options, parse_timeout, settings_from_args, write_outputs

DESCRIPTION = ("Save and load a synthetic sharded state dict with torch.distributed.checkpoint across N ranks "
               "(gloo on CPU, NCCL with CUDA tensors on GPUs) to a directory or an s3:// prefix; time the slowest "
               "rank and report GB/s. --size is the total across ranks, split evenly.")


def add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--size", default="1G", help="total checkpoint bytes across all ranks, binary units (default 1G)")
    p.add_argument("--target", required=True, help="directory or s3://bucket/prefix; the run writes only inside a "
                   "unique directory it creates there and removes afterwards")
    p.add_argument("--nproc", default=None, help="local ranks to spawn when not launched by torchrun/srun/mpirun "
                   "(default: number of GPUs, else 2)")
    p.add_argument("--async", dest="async_save", action="store_true",
                   help="also time dcp.async_save: time training is blocked vs time until durable")
    p.add_argument("--endpoint", default=None, help="S3 endpoint URL for s3:// targets (credentials from the "
                   "standard AWS environment/profile); default: start an embedded server (rclone serve s3)")
    p.add_argument("--dtype", default="float32", help=f"one of {', '.join(ck.DTYPES)} (default float32)")
    p.add_argument("--threads", default="1", help="DCP writer threads per rank (default 1)")
    p.add_argument("--backend", default="auto", help="auto, nccl or gloo (default auto: nccl with CUDA, else gloo)")
    p.add_argument("--keep", action="store_true", help="keep the run's checkpoint directory instead of removing it")
    p.add_argument("--check", action=argparse.BooleanOptionalAction, default=True,
                   help="load what was saved and compare every element (default on)")
    p.add_argument("--timeout", default="300", help="seconds before a silent peer fails the run (default 300)")
    add_sweep_options(p, warmup=1, iters=3, budget_s=30.0)


def resolve(args: argparse.Namespace) -> tuple[ck.Config, ct.Target, backends.BackendChoice, int]:
    """Validate every flag before any rank starts, so misuse fails fast with exit 2."""
    size = parse_size(args.size, what="--size")
    target = ct.parse_target(args.target)
    nproc = parse_positive_int(args.nproc, what="--nproc", example="2") if args.nproc is not None else local_ranks()
    threads = parse_positive_int(args.threads, what="--threads", example="2")
    if args.dtype not in ck.DTYPES:
        raise UsageError(f"invalid --dtype {args.dtype!r}: expected one of {', '.join(ck.DTYPES)} (e.g. --dtype bfloat16)")
    if args.endpoint is not None and target.kind != "s3":
        raise UsageError(f"--endpoint only applies to s3:// targets; --target {args.target!r} is a directory")
    choice = backends.choose(args.backend)
    spec = detect_world()
    ranks = spec.size if spec is not None else nproc
    try:
        ck.layout(size, ranks, ck.ELEM[args.dtype])  # too small for the world: fail now
    except UsageError as exc:
        raise UsageError(f"invalid --size {args.size!r}: {str(exc).split(': ', 1)[1]}") from None
    config = ck.Config(size_bytes=size, target=target.display, async_save=args.async_save, dtype=args.dtype,
                       thread_count=threads, keep=args.keep, device=choice.device, backend=choice.backend)
    return config, target, choice, nproc


def run(args: argparse.Namespace) -> int:
    config, target, choice, nproc = resolve(args)
    settings = settings_from_args(args, check=args.check)
    timeout_s = parse_timeout(args.timeout)
    launching = detect_world() is None
    with contextlib.ExitStack() as stack:
        if launching:
            check_local_world(nproc)  # before the memory check, which scales with nproc
            choice = _preflight(stack, args, config, target, choice, nproc)
        return in_world(nproc=nproc, timeout_s=timeout_s, choice=choice,
                        body=lambda world: _body(world, args, config, target, settings))


def _preflight(stack: contextlib.ExitStack, args: argparse.Namespace, config: ck.Config, target: ct.Target,
               choice: backends.BackendChoice, nproc: int) -> backends.BackendChoice:
    """Checks the launching process makes once, before spawning ranks: memory, the target, and
    for s3:// without --endpoint the embedded server the ranks will use."""
    if choice.device == "cpu":
        need = ck.host_bytes_per_rank(config.size_bytes, nproc, config.async_save) * nproc
        free = free_memory_bytes("cpu")
        shortfall = memory_shortfall(need, free, "host memory")
        if shortfall:
            raise UsageError(f"--size {format_size(config.size_bytes)} over {nproc} ranks {shortfall}; "
                             f"use a smaller --size")
    if target.kind == "local":
        ct.preflight_local(target, config.size_bytes)
        return choice
    if args.endpoint:
        ct.check_endpoint_reachable(args.endpoint)
        access = ct.S3Access(args.endpoint)
        probe_dir = ct.RunDir(target, ct.unique_name(), access)
        probe_dir.create()  # the bucket exists and the credentials work
        return choice
    server = needs.embedded_s3(stack, target.bucket, ct.required_bytes(config.size_bytes), "a smaller --size")
    return dataclasses.replace(choice, env={**choice.env, **needs.embedded_s3_env(server)})


def _s3_access(args: argparse.Namespace) -> ct.S3Access:
    if args.endpoint:
        return ct.S3Access(args.endpoint)
    server = needs.embedded_s3_from_env()
    if server is None:
        raise UsageError("an s3:// target under torchrun/srun/mpirun needs --endpoint URL (the embedded server is "
                         "only started for ranks microbench spawns itself)")
    return ct.S3Access(server["endpoint"], server["key"], server["secret"], embedded=True, root_dir=server["root"])


def _body(world: Any, args: argparse.Namespace, config: ck.Config, target: ct.Target, settings: Any) -> int:
    access = _s3_access(args) if target.kind == "s3" else None
    run_dir = needs.shared_run_dir(world, target, access, ct.required_bytes(config.size_bytes), "the checkpoint")
    try:
        if config.device == "cuda":
            need = ck.host_bytes_per_rank(config.size_bytes, world.size, False)
            free = free_memory_bytes("cuda")
            shortfall = memory_shortfall(need, free, "GPU memory per rank")
            if shortfall:
                raise UsageError(f"--size {format_size(config.size_bytes)} over {world.size} ranks {shortfall}; "
                                 f"use a smaller --size or more ranks")
        probe = ck.CheckpointProbe(config, world, run_dir)
        outcome = run_probe(probe, settings, config=config, world=world, json_path=args.json,
                            results_dir=args.results_dir)
    finally:
        if world.rank == 0 and not config.keep:
            run_dir.remove()
    if world.rank != 0:
        return 0
    outcome.record["implementation"]["run_dir"] = run_dir.display if config.keep else f"{run_dir.display} (removed)"
    print_report(outcome.record, config)
    write_outputs(args, outcome)
    print(f"# results: {outcome.path}")
    wrong = sum(r["nwrong"] or 0 for r in outcome.rows if "checked_by" not in r)  # counted once, by the load
    if wrong:
        raise RunError(f"{wrong} wrong element(s) after loading the checkpoint (see #wrong); the storage or DCP "
                       f"returned different bytes than were saved")
    return 0


def print_report(record: dict, config: ck.Config) -> None:
    impl = record["implementation"]
    world = record["config"]["world"]
    where = impl.get("s3_endpoint", "")
    if impl.get("s3_embedded_server"):
        where = "embedded S3 server (rclone serve s3)"
    print(f"# microbench checkpoint: {world['size']} ranks, backend {impl['backend']} on {impl['device']}, "
          f"{impl['state_dict']}, {config.dtype}")
    print(f"# target {config.target}{' via ' + where if where else ''}; storage {impl['storage']}; "
          f"durable = {impl['durable_when']}")
    table = []
    for row in record["rows"]:
        gbps = row.get("write_gbps", row.get("read_gbps"))
        blocked = f"{row['blocked_time_us'] / 1e3:.1f}" if "blocked_time_us" in row else "-"
        wrong = "N/A" if row.get("nwrong") is None else row["nwrong"]
        if row.get("checked_by"):
            wrong = f"{'not checked' if row.get('nwrong') is None else row['nwrong']} (by {row['checked_by']})"
        table.append((row["op"], format_size(row["size_bytes"]), format_size(row["bytes_per_rank"]), row["iters"],
                      f"{row['time_us']['p50'] / 1e3:.1f}", f"{row['time_us']['max'] / 1e3:.1f}", blocked,
                      f"{gbps:.3f}", wrong))
    print(tabulate(table, headers=["op", "total", "per rank", "iters", "time p50 (ms)", "max (ms)",
                                   "blocked (ms)", "GB/s", "#wrong"], tablefmt="simple"))
    summary = record.get("summary", {})
    if "async_blocked_fraction" in summary:
        print(f"# async_save: training blocked for {100 * summary['async_blocked_fraction']:.0f}% of the time "
              f"until the checkpoint was durable")
    print(f"# time = slowest rank; GB/s = total bytes / time (1e9 B/s); page cache before load: "
          f"{summary.get('page_cache_before_load', 'n/a')}")
    if any(row.get("checked_by") for row in record["rows"]):
        print("# #wrong (by load): the load case read the save's last checkpoint and checked every element")
