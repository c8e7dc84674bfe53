from __future__ import annotations

import argparse
import json

from ..world import environment as envmod


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("env", help="print the environment block every result record carries")
    p.add_argument("--json", action="store_true", help="machine-readable JSON on stdout")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    data = envmod.collect()
    print(json.dumps(data, indent=1) if args.json else envmod.format_env(data))
    return 0
