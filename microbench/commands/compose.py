"""`microbench compose`: predicted FSDP2 step time, memory per GPU and checkpoint time per
storage tier, for one model over one or more networks and tiers (the what-if tables), from
saved records or described hardware. The flags are compose/inputs/sections.py's; this parses
them, builds the typed inputs, calls the composer once (compose/whatif.py) and prints what it
found (compose/printed.py)."""

from __future__ import annotations

import argparse
import sys

from ..compose import inputs, whatif
from ..compose.inputs.job_sections import Output
from ..compose.inputs.sections import ComposeOptions
from ..compose.printed import print_composition
from ..core import sections
from ..results import RecordWriter, write_csv
from ..results.outputs import check_new_file


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "compose",
        help="predict FSDP2 step time, memory per GPU and checkpoint time per tier",
        description="Predict an FSDP2 training step (compute, AllGather, ReduceScatter, optimizer, "
        "overlap) and checkpoint times from a model's shapes, a GPU and networks and "
        "storage tiers, measured (records) or described (--net, --tier). Several "
        "--net/--nccl and --tier/--storage give what-if tables side by side.",
    )
    sections.add_sections(p, ComposeOptions)
    p.set_defaults(handler=run)


def _refuse_existing(output: Output) -> None:
    for flag, path in (("--json", output.json), ("--csv", output.csv)):
        if path:
            check_new_file(path, flag, noun=flag, kept="results", parents_made=flag == "--json")


def run(args: argparse.Namespace) -> int:
    output = sections.parse_section(Output, args)
    _refuse_existing(output)  # before anything else is read
    opts = sections.parse_sections(ComposeOptions, args)
    result = whatif.compose(inputs.build(opts))
    print_composition(result)
    record = whatif.record(result)
    path = RecordWriter(record, output.json, directory=output.results_dir).finish("complete")
    if output.csv:
        write_csv(output.csv, record["rows"])
    sys.stdout.flush()
    print(f"\n# record: {path}")
    return 0
