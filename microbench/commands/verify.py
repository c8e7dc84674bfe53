"""`microbench verify fsdp`: real FSDP2 steps, predicted vs measured."""

from __future__ import annotations

import argparse
import os

from tabulate import tabulate

from .. import backends, env as envmod, native, verify
from ..results import RecordWriter, load_record, new_record
from ..session import in_world, local_ranks
from ..sizes import parse_positive_int
from .common import parse_timeout


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("verify", help="real FSDP2 steps vs the composer's prediction, with the error")
    vs = p.add_subparsers(dest="what", metavar="WHAT")
    vs.required = True
    f = vs.add_parser("fsdp", help="fully_shard an MLP stack, time real steps, compare with the prediction")
    f.add_argument("--nproc", default=None, help="local ranks when not launched (default: GPUs, else 2)")
    f.add_argument("--hidden", default="256", help="hidden size h; each unit has 8h^2+5h parameters (default 256)")
    f.add_argument("--layers", default="4", help="FSDP units (default 4)")
    f.add_argument("--tokens", default="512", help="tokens per rank per step (default 512)")
    f.add_argument("--steps", default="6", help="timed steps (default 6)")
    f.add_argument("--nccl", default=None, metavar="RECORD",
                   help="use this saved collective record instead of measuring the unit sizes now")
    f.add_argument("--backend", default="auto", help="auto, nccl or gloo")
    f.add_argument("--timeout", default="120", help="seconds before a silent peer fails the run")
    f.add_argument("--json", default=None, metavar="PATH")
    f.add_argument("--results-dir", default="results")
    f.set_defaults(handler=run_fsdp)


def run_fsdp(args: argparse.Namespace) -> int:
    import torch

    cfg = verify.FsdpVerifyConfig(hidden=parse_positive_int(args.hidden, what="--hidden", example="256"),
                                  layers=parse_positive_int(args.layers, what="--layers", example="4"),
                                  tokens=parse_positive_int(args.tokens, what="--tokens", example="512"),
                                  steps=parse_positive_int(args.steps, what="--steps", example="6"),
                                  nccl_record=args.nccl)
    saved = load_record(args.nccl) if args.nccl else None
    nproc = parse_positive_int(args.nproc, what="--nproc", example="2") if args.nproc else local_ranks()
    choice = backends.choose(args.backend)
    if choice.device == "cuda":
        cfg.dtype = "bfloat16"
    timeout_s = parse_timeout(args.timeout)

    def body(world) -> int:
        if choice.device == "cpu":
            # Ranks share the cores: one rank per core's worth of threads, as a launcher would set.
            local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // local))
        device = torch.device("cuda", torch.cuda.current_device()) if choice.device == "cuda" else torch.device("cpu")
        flops = verify.calibrate_flops(world, cfg, device)
        curves = saved if saved is not None else verify.measure_curves(world, cfg, choice.device, choice.backend)
        steps = verify.measure_fsdp(world, cfg, device)
        if world.rank != 0:
            return 0
        measured = sorted(steps)[len(steps) // 2]
        pred = verify.predict(cfg, world.size, flops, curves)
        record = new_record("verify-fsdp", {"verify": vars(cfg), "nproc": world.size, "backend": choice.backend},
                            envmod.collect(), {**native.implementation(), "engine": "torch fully_shard (FSDP2)",
                                               "backend": choice.backend, "device": choice.device})
        row = {"probe": "verify-fsdp", "op": "fsdp_step", "ranks": world.size, "flops_per_rank": flops,
               "measured_step_s": measured, "measured_steps_s": steps, "predicted": pred,
               "error_pct": verify.error_pct(pred["step_s"], measured),
               "curves_from": args.nccl or "measured in this run"}
        writer = RecordWriter(record, args.json, args.results_dir)
        writer.add_rows([row])
        path = writer.finish("complete")
        print(f"# verify fsdp: {world.size} ranks ({choice.backend}/{choice.device}), {cfg.layers} units of "
              f"{verify.unit_params(cfg.hidden):,} params, {cfg.tokens} tokens/rank, "
              f"compute {flops / 1e9:.1f} GFLOP/s per rank (calibrated)")
        table = [("compute", pred["compute_s"]), ("allgather fwd+bwd", pred["allgather_fwd_s"] + pred["allgather_bwd_s"]),
                 ("reduce-scatter", pred["reduce_scatter_s"]), ("bound: no overlap", pred["no_overlap_s"]),
                 ("bound: full overlap", pred["full_overlap_s"]), ("predicted step", pred["step_s"]),
                 ("measured step (median)", measured)]
        print(tabulate([(k, f"{v * 1e3:.1f}") for k, v in table], headers=["", "ms"], tablefmt="simple"))
        print(f"# error: {row['error_pct']:+.1f}% (predicted vs measured); curves: {row['curves_from']}")
        for note in pred["notes"]:
            print(f"# {note}")
        print(f"# results: {path}")
        return 0

    return in_world(nproc=nproc, timeout_s=timeout_s, choice=choice, body=body)
