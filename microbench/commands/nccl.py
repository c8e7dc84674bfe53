"""`microbench nccl`: collective bandwidth in the nccl-tests layout."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile

from ..world import backends
from ..targets import native
from ..world.launch import detect_world
from ..core.errors import RunError, UsageError
from ..expect import overrides as expectations
from ..lab import placement as labrun
from ..probes import nccl as coll
from ..world.policy import free_memory_bytes, in_world, local_ranks, transport_note
from ..core.units import parse_list, parse_number, parse_positive_int, parse_sizes
from ..run.runner import run_probe
from ..probes.nccl.table import CollectiveStream, collective_table
from .common import add_sweep_options, parse_timeout, settings_from_args, write_outputs


NCCL_LOG_DIR_ENV = "MICROBENCH_NCCL_LOG_DIR"


DESCRIPTION = ("Sweep collectives over message sizes; print time, algbw, busbw and #wrong "
               "per size in the nccl-tests layout, fit a latency-bandwidth model per op.")


def add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sizes", default="1M-256M", help="1M-4G (range), 64M, or 1M,8M,64M; binary units (default 1M-256M)")
    p.add_argument("--factor", default="2", help="step between sizes of a range (default 2)")
    p.add_argument("--ops", default=",".join(coll.DEFAULT_OPS), help=f"some of {','.join(coll.OPS)} "
                   f"(default: {','.join(coll.DEFAULT_OPS)}, the ones FSDP uses)")
    p.add_argument("--dtype", default=None, help="float32, bfloat16 or float16 (default bfloat16 on GPU, float32 on CPU)")
    p.add_argument("--nproc", default=None, help="local ranks to spawn when not launched by torchrun/srun/mpirun "
                   "(default: number of GPUs, else 2)")
    p.add_argument("--backend", default="auto", help="auto, nccl or gloo (default auto: nccl with CUDA, else gloo)")
    p.add_argument("--algo", default="torch",
                   help="torch: the library's collectives, what FSDP gets (default); ring: microbench's rings over "
                        "send/recv, the fabric's capability (reduce_scatter, all_gather, all_reduce)")
    p.add_argument("--transport", default="auto", help="auto, ib or tcp (ib needs NCCL and InfiniBand)")
    p.add_argument("--check", action=argparse.BooleanOptionalAction, default=True,
                   help="verify every result element against the known pattern (default on)")
    p.add_argument("--timeout", default="60", help="seconds before a silent peer fails the run (default 60)")
    p.add_argument("--lab", default=None, metavar="NAME", help="place one rank per host of this lab (see `microbench lab`)")
    p.add_argument("--link-profiles", default=None, metavar="RATES",
                   help="with --lab: run the sweep under each egress rate, e.g. 1gbit,unlimited, and print the "
                        "sweeps side by side with their ratio")
    p.add_argument("--measure-link", action="store_true",
                   help="measure the rank 0 - rank 1 TCP link first (2 ranks) and state busbw as a share of it")
    p.add_argument("--link-result", default=None, metavar="FILE",
                   help="a `microbench link` record: report busbw as a percentage of that measured link")
    expectations.add_option(p, "busbw")
    # 1 s of timed work per case (>= 3 iterations): the default 1M-256M sweep of three ops then
    # ends in about a minute on two CPU ranks; small sizes still run all --iters.
    add_sweep_options(p, budget_s=1.0)


def resolve(args: argparse.Namespace) -> tuple[coll.Config, backends.BackendChoice, int]:
    """Validate every flag before any rank starts, so misuse fails fast with exit 2."""
    factor = parse_number(args.factor, what="--factor", example="2", minimum=1.0, allow_minimum=False)
    sizes = parse_sizes(args.sizes, factor=factor)
    ops = parse_list(args.ops, tuple(coll.OPS), what="--ops")
    if args.dtype is not None and args.dtype not in coll.DTYPES:
        raise UsageError(f"invalid --dtype {args.dtype!r}: expected one of {', '.join(coll.DTYPES)} (e.g. --dtype bfloat16)")
    nproc = parse_positive_int(args.nproc, what="--nproc", example="2") if args.nproc is not None else local_ranks()
    choice = backends.choose(args.backend, args.transport)
    dtype = args.dtype or ("bfloat16" if choice.device == "cuda" else "float32")
    coll.check_algo(args.algo, ops)
    return coll.Config(sizes=sizes, ops=ops, dtype=dtype, backend=choice.backend, device=choice.device,
                       algo=args.algo), choice, nproc


def run(args: argparse.Namespace) -> int:
    if args.link_profiles and detect_world() is None:
        return labrun.run_profiles(args.lab, args.link_profiles, sys.argv[1:], json_path=args.json,
                                   results_dir=args.results_dir)
    settings = settings_from_args(args, check=args.check)
    timeout_s = parse_timeout(args.timeout)
    config, choice, nproc = resolve(args)
    choice, nccl_log_dir = _nccl_log(choice)
    link_gbps = labrun.link_gbps_from(args.link_result) if args.link_result else None
    given = expectations.override(args.expected)
    per_rank, master_addr = None, "127.0.0.1"
    if args.lab and detect_world() is None:
        nproc, master_addr, per_rank = labrun.lab_placement(args.lab, args.nproc)

    def before_launch() -> None:
        coll.check_memory(config.ops, config.sizes, nproc, free_memory_bytes(choice.device),
                          "GPU memory" if choice.device == "cuda" else "host memory")

    def body(world) -> int:
        local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        coll.check_memory(config.ops, config.sizes, local if choice.device == "cpu" else 1,
                          free_memory_bytes(choice.device), "GPU memory" if choice.device == "cuda" else "host memory")
        probe = coll.CollectiveProbe(config, world, transport=lambda: transport_note(choice, nccl_log_dir))
        expect = expectations.for_collectives(world, config.ops, choice.device, given)
        probe.expected = expect["expected"]
        with labrun.naming_lab_hosts(args.lab, world):
            ceiling = link_gbps
            if args.measure_link:
                ceiling = measure_link_gbps(world, timeout_s)
            # Piped or under srun there is no progress bar: print each size as it finishes instead.
            stream, transport_at_start = None, None
            if world.rank == 0 and not sys.stdout.isatty():
                start_impl = {**native.implementation(), **probe.implementation()}
                transport_at_start = start_impl.get("transport_used")
                print(header_line(world.size, start_impl, config), flush=True)
                stream = CollectiveStream([(c.op, c.size_bytes, c.param("placement")) for c in probe.cases()],
                                          coll.element_size(config.dtype), emit=_emit, link_gbps=ceiling,
                                          expected=expect["expected"])
            # The table's own lines are the progress here; the generic per-case lines would repeat them.
            run_settings = dataclasses.replace(settings, progress=False) if stream else settings
            outcome = run_probe(probe, run_settings, config=config, world=world, json_path=args.json,
                                on_row=stream.on_row if stream else None,
                                results_dir=args.results_dir, extra_implementation={"backend_reason": choice.reason,
                                                      **labrun.lab_facts()},
                                extra_summary={**expect, **({"link_gbps": ceiling,
                                               "link_from": "measured in this run" if args.measure_link
                                               else args.link_result} if ceiling else {})})
        if world.rank != 0:
            return 0
        if stream is None:
            print_report(outcome.record, config, ceiling)
        elif outcome.record["implementation"].get("transport_used") != transport_at_start:
            # NCCL names its transport only once it has connected, after the header went out.
            print(f"# transport used: {outcome.record['implementation'].get('transport_used', 'unknown')}")
        write_outputs(args, outcome)
        wrong = sum(r["nwrong"] or 0 for r in outcome.rows)
        print(f"# results: {outcome.path}")
        if wrong:
            raise RunError(f"{wrong} wrong element(s) in the results (see the #wrong columns); "
                           f"the fabric or the collective library corrupted data")
        return 0

    return in_world(nproc=nproc, timeout_s=timeout_s, choice=choice, body=body, before_launch=before_launch,
                    per_rank=per_rank, master_addr=master_addr)


def measure_link_gbps(world, timeout_s: float) -> float:
    """The same-run link ceiling: one-way TCP between rank 0 and rank 1 at 64 MiB with the link
    probe, before the sweep, so busbw can be stated as a share of the measured link."""
    from ..probes import link
    from ..run.runner import SweepSettings, measure_case

    if world.size != 2:
        raise UsageError(f"--measure-link needs exactly 2 ranks (this world has {world.size}); measure the "
                         f"link once with `microbench link` and pass it with --link-result FILE")
    probe = link.LinkProbe(link.Config(sizes=[64 << 20], ops=["uni"], timeout_s=timeout_s), world)
    try:
        (case,) = probe.cases()
        row = measure_case(probe, case, SweepSettings(warmup=1, iters=3, budget_s_per_case=3.0, check=False), world)
    finally:
        probe.close()
    return row["bw_gbps"]


def _nccl_log(choice: backends.BackendChoice) -> tuple[backends.BackendChoice, str | None]:
    """Turn on NCCL's INIT/NET log into a per-run directory: it is the only reliable word on
    which transport NCCL picked. The launcher makes the directory and every rank inherits it;
    a user's own NCCL_DEBUG setting is left alone (the transport is then "unknown")."""
    if choice.backend != "nccl":
        return choice, None
    log_dir = os.environ.get(NCCL_LOG_DIR_ENV)
    if log_dir is None:
        if "NCCL_DEBUG" in os.environ:
            return choice, None
        log_dir = tempfile.mkdtemp(prefix="microbench-nccl-")
    env = {**choice.env, NCCL_LOG_DIR_ENV: log_dir, "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET",
           "NCCL_DEBUG_FILE": os.path.join(log_dir, "nccl.%h.%p.log")}
    return dataclasses.replace(choice, env=env), log_dir


def header_line(ranks: int, impl: dict, config: coll.Config) -> str:
    return (f"# microbench nccl: {ranks} ranks, backend {impl['backend']} on {impl['device']}, "
            f"transport {impl.get('transport_used', 'unknown')}, dtype {config.dtype}, algo {config.algo}, "
            f"implementation {impl['name']}")


def _emit(text: str) -> None:
    print(text, flush=True)


def print_report(record: dict, config: coll.Config, link_gbps: float | None = None) -> None:
    print(header_line(record["config"]["world"]["size"], record["implementation"], config))
    fits = record["summary"].get("fits", {})
    expected = record["summary"].get("expected", {})
    for op in config.ops:
        rows = [r for r in record["rows"] if r["op"] == op]
        if rows:
            print(collective_table(op, rows, fits.get(op), link_gbps=link_gbps, expected=expected.get(op)))
            print()
