"""Running modelload: the model directory written once by rank 0 (removed afterwards), the
world when there is more than one rank, and the table."""

from __future__ import annotations

import contextlib
import os
import uuid
from typing import Any

from ...core.errors import RunError
from ...core.units import format_bytes_human
from ...run import provision
from ...run.runner import RunOutcome, run_probe, skip
from ...targets import checkpoint_target as ct
from ...targets.workdir import mount_of
from ...world.dist import World
from . import model_dir as md, store
from .store import LocalModel, S3Model

MEMORY_FILESYSTEMS = ("tmpfs", "ramfs", "hugetlbfs", "devtmpfs")


def run(spec: Any, config: Any, inv: Any) -> RunOutcome | None:
    reason = md.safetensors_missing()
    if reason:   # before a byte is written or a rank started
        skip(spec.name, reason, config, inv.settings, json_path=inv.json_path, results_dir=inv.results_dir)
    lay = md.layout(config.size_bytes, config.dtype, md_elem(config.dtype))
    target = ct.parse_target(config.target)
    outcomes: list[RunOutcome] = []
    with contextlib.ExitStack() as stack:
        server, env = provision.embedded_s3_for_ranks(stack, target, config.endpoint, lay.total_bytes + (16 << 20),
                                                      "a smaller --size")

        def body(world: World) -> int:
            outcome = _body(spec, world, config, lay, target, server, inv)
            if outcome is not None:
                outcomes.append(outcome)
            return 0

        provision.ranks_or_here(inv, config.nproc, config.timeout_s, "auto", env, body)
    return outcomes[0] if outcomes else None


def md_elem(dtype: str) -> int:
    from ...core.units import DTYPE_BYTES

    return DTYPE_BYTES[dtype]


def _body(spec: Any, world: World, config: Any, lay: md.Layout, target: ct.Target, server: Any,
          inv: Any) -> RunOutcome | None:
    import torch

    rank = world.rank if world is not None else 0
    name = f"microbench-modelload-{uuid.uuid4().hex[:12]}"
    if world is not None:
        name = world.broadcast_object(name if rank == 0 else None)
    common = {"model": config.model, "shard_files": lay.shards, "index": md.INDEX,
              "capped_from_bytes": config.capped_from_bytes}
    model: LocalModel | S3Model
    if target.kind == "local":
        fs = mount_of(target.path)["fstype"]
        root = os.path.join(target.path, name)
        model = LocalModel(lay, root, {"target_kind": "local", "model_dir": root, "filesystem": fs, **common,
                                       "cache_drop": "posix_fadvise(DONTNEED) on every shard before each case"})
    else:
        s3, server_root = provision.s3_target(config.endpoint, server)
        s3.timeout_s = config.timeout_s
        prefix = "/".join(p for p in (target.path.partition("/")[2], name) if p)
        fs = mount_of(server_root)["fstype"] if server_root else "remote"
        model = S3Model(lay, s3, target.bucket, prefix, server_root,
                        {"target_kind": "s3", "model_dir": f"s3://{target.bucket}/{prefix}", "filesystem": fs,
                         "s3": s3.describe(), **common,
                         "fetch": f"ranged GETs of {store.PART_BYTES >> 20} MiB, "
                                  f"{store.CONCURRENCY} at a time, then safetensors.torch.load of the bytes",
                         "cache_drop": ("posix_fadvise(DONTNEED) on the embedded server's files before each case"
                                        if server_root else "not dropped (remote S3 server: its cache is out of "
                                        "reach)")})
    model.facts["memory_backed"] = fs in MEMORY_FILESYSTEMS
    created: list[bool] = []

    def write() -> None:
        created.append(True)
        try:
            model.write(torch)
        except OSError as exc:
            raise RunError(f"writing the model under {model.root} failed: {exc.strerror or exc}") from None

    try:
        provision.on_rank0(world, write)
        probe = spec.build(config, provision.Context(world=world, run_dir=model))
        outcome = run_probe(probe, inv.settings, config=config, world=world, json_path=inv.json_path,
                            results_dir=inv.results_dir)
    finally:
        if rank == 0 and created and not config.keep:
            model.remove()
    if rank != 0:
        return None
    outcome.notes["kept"] = model.root if config.keep else None
    return outcome


def print_report(outcome: RunOutcome, config: Any) -> str | None:
    from ...core.tables import text_table

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
    print(text_table(table, headers=["op", "ranks", "tensors", "load_s", "GB/s", "raw read GB/s", "all ranks GB/s",
                                   "#wrong"], tablefmt="simple"))
    print(f"# page cache: {impl['cache_drop']}; time = slowest rank; GB/s = model bytes / time (1e9 B/s)")
    if mem:
        print(f"# (memory!): the model is on {impl['filesystem']}, memory: these are not storage rates")
    kept = outcome.notes.get("kept")
    print(f"# model directory {'kept at ' + kept if kept else 'removed'}; results: {outcome.path}")
    wrong = sum(r["nwrong"] or 0 for r in outcome.rows)
    return f"{wrong} wrong element(s) in the loaded tensors (see #wrong)" if wrong else None


