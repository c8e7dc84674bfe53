"""`microbench storage fio`: the posix workload run by fio, recorded in the same format."""

from __future__ import annotations

import argparse

from ..errors import ProbeUnavailable
from ..probes import storage_fio as sf
from .common import add_sweep_options, settings_from_args
from .storage_posix import add_target_options, config_from_args, print_report, run_storage


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("fio", help="the same file workload through fio (subprocess, JSON output)",
                       description="Run fio on a test file with the posix subcommand's workload flags.")
    add_target_options(p)
    add_sweep_options(p, warmup=1, iters=5, budget_s=2.0)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    reason = sf.fio_unavailable_reason()
    if reason:
        raise ProbeUnavailable(reason)
    outcome = run_storage(sf.FioProbe, config, settings_from_args(args, check=False), args)
    print_report(outcome, config, ("fio",))
    return 0
