"""Running modelload: the model directory written once by rank 0 (removed afterwards), the
world when there is more than one rank, and the table."""

from __future__ import annotations

import os
import shutil
import uuid
from dataclasses import dataclass, field
from typing import Any

from ...core.units import format_bytes_human
from ...run import provision
from ...run.runner import RunOutcome, run_probe, skip
from ...targets.workdir import mount_of
from ...world import backends
from ...world.launch import detect_world
from ...world.policy import in_world
from . import model_dir as md

MEMORY_FILESYSTEMS = ("tmpfs", "ramfs", "hugetlbfs", "devtmpfs")


@dataclass
class Model:
    layout: md.Layout
    root: str
    paths: list[str]
    facts: dict[str, Any] = field(default_factory=dict)


def run(spec: Any, config: Any, inv: Any) -> RunOutcome | None:
    reason = md.safetensors_missing()
    if reason:   # before a byte is written or a rank started
        skip(spec.name, reason, config, inv.settings, json_path=inv.json_path, results_dir=inv.results_dir)
    lay = md.layout(config.size_bytes, config.dtype, md_elem(config.dtype))
    outcomes: list[RunOutcome] = []

    def body(world: Any) -> int:
        outcome = _body(spec, world, config, lay, inv)
        if outcome is not None:
            outcomes.append(outcome)
        return 0

    if detect_world() is None and config.nproc == 1:
        body(None)
    else:
        inv.exit_code = in_world(nproc=config.nproc, timeout_s=config.timeout_s, choice=backends.choose("auto"), body=body,
                 argv=inv.argv)
    return outcomes[0] if outcomes else None


def md_elem(dtype: str) -> int:
    from ...core.units import DTYPE_BYTES

    return DTYPE_BYTES[dtype]


def _body(spec: Any, world: Any, config: Any, lay: md.Layout, inv: Any) -> RunOutcome | None:
    import torch

    rank = world.rank if world is not None else 0
    name = f"microbench-modelload-{uuid.uuid4().hex[:12]}"
    if world is not None:
        name = world.broadcast_object(name if rank == 0 else None)
    root = os.path.join(config.path, name)
    fs = mount_of(config.path)["fstype"]
    model = Model(lay, root, [os.path.join(root, lay.shard_name(k)) for k in range(lay.shards)],
                  {"model_dir": root, "filesystem": fs, "model": config.model, "shard_files": lay.shards,
                   "index": md.INDEX, "capped_from_bytes": config.capped_from_bytes,
                   "memory_backed": fs in MEMORY_FILESYSTEMS,
                   "cache_drop": "posix_fadvise(DONTNEED) on every shard before each case"})
    created: list[str] = []

    def write() -> None:
        os.mkdir(root)
        created.append(root)
        try:
            md.write(torch, lay, root)
        except OSError as exc:
            from ...core.errors import RunError

            raise RunError(f"writing the model under {root} failed: {exc.strerror or exc}") from None

    try:
        provision.on_rank0(world, write)
        probe = spec.build(config, provision.Context(world=world, run_dir=model))
        outcome = run_probe(probe, inv.settings, config=config, world=world, json_path=inv.json_path,
                            results_dir=inv.results_dir)
    finally:
        if rank == 0 and created and not config.keep:
            shutil.rmtree(root, ignore_errors=True)
    if rank != 0:
        return None
    outcome.notes["kept"] = root if config.keep else None
    return outcome


def print_report(outcome: RunOutcome, config: Any) -> str | None:
    from tabulate import tabulate

    impl = outcome.record["implementation"]
    what = f"--model {config.model}" if config.model else "--size"
    capped = (f" (capped from {format_bytes_human(impl['capped_from_bytes'])} to fit)"
              if impl.get("capped_from_bytes") else "")
    print(f"# microbench modelload: {format_bytes_human(config.size_bytes)} {config.dtype} ({what}){capped} in "
          f"{impl['shard_files']} safetensors shards + {impl['index']} at {impl['model_dir']} ({impl['filesystem']}); "
          f"{impl['engine']} onto {impl['device']}")
    mem = " (memory!)" if impl.get("memory_backed") else ""
    table = []
    for row in outcome.rows:
        gbps = row.get("load_gbps", row.get("raw_read_gbps"))
        table.append((row["op"], row["ranks"], row["tensors"], f"{row['load_s']:.3f}", f"{gbps:.3f}{mem}",
                      f"{row['raw_read_gbps']:.3f}{mem}" if "raw_read_gbps" in row else "-",
                      f"{row['aggregate_read_gbps']:.3f}" if "aggregate_read_gbps" in row else "-",
                      "N/A" if row.get("nwrong") is None else row["nwrong"]))
    print(tabulate(table, headers=["op", "ranks", "tensors", "load_s", "GB/s", "raw read GB/s", "all ranks GB/s",
                                   "#wrong"], tablefmt="simple", disable_numparse=True))
    print(f"# page cache: {impl['cache_drop']}; time = slowest rank; GB/s = model bytes / time (1e9 B/s)")
    if mem:
        print(f"# (memory!): the model is on {impl['filesystem']}, memory: these are not storage rates")
    kept = outcome.notes.get("kept")
    print(f"# model directory {'kept at ' + kept if kept else 'removed'}; results: {outcome.path}")
    wrong = sum(r["nwrong"] or 0 for r in outcome.rows)
    return f"{wrong} wrong element(s) in the loaded tensors (see #wrong)" if wrong else None


