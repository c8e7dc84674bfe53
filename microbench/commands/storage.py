"""`microbench storage ...`: one group, one module per storage subcommand.

Each module in STORAGE_MODULES has add_parser(subparsers) and run(args) -> int, like the
top-level commands; adding a storage subcommand (s3, gds) is one line here.
"""

from __future__ import annotations

import argparse
import importlib

STORAGE_MODULES = [
    "storage_posix",
    "storage_fio",
    "storage_s3",
    "storage_gds",
]


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("storage", help="file, object-store and GPU-direct storage throughput",
                       description="Storage throughput and latency: posix (native engine), fio, and more.")
    inner = p.add_subparsers(dest="storage_command", metavar="KIND", parser_class=type(p))
    inner.required = True
    for name in STORAGE_MODULES:
        importlib.import_module(f"microbench.commands.{name}").add_parser(inner)
