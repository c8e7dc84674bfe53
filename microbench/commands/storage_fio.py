"""`microbench storage fio`: the posix workload run by fio, recorded in the same format."""

from __future__ import annotations

import argparse

from ..probes.storage import fio as sf
from .common import add_sweep_options, settings_from_args
from .storage_posix import add_target_options, config_from_args, print_report, run_storage


DESCRIPTION = "Run fio on a test file with the posix subcommand's workload flags."


def add_options(p: argparse.ArgumentParser) -> None:
    add_target_options(p)
    add_sweep_options(p, warmup=1, iters=5, budget_s=2.0)


def run(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    outcome = run_storage(sf.FioProbe, config, settings_from_args(args, check=False), args)
    print_report(outcome, config, ("fio",))
    return 0
