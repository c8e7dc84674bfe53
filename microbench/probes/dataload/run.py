"""Running dataload: the embedded S3 server (launcher), the dataset written once by rank 0 and
removed afterwards, the world when there is more than one rank, and the table."""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from dataclasses import dataclass, field
from typing import Any

from ...core.units import format_size
from ...run import provision
from ...run.runner import RunOutcome, run_probe
from ...targets import checkpoint_target as ct
from ...targets.workdir import drop_pages, mount_of
from ...world.dist import World
from . import dataset as ds
from .loader import Source

MEMORY_FILESYSTEMS = ("tmpfs", "ramfs", "hugetlbfs", "devtmpfs")


@dataclass
class Dataset:
    """The written dataset as the probe reads it: its plan, where it is, and what can be said
    about its cache."""

    plan: ds.Plan
    source: Source
    cache_paths: list[str]                 # files whose pages are dropped before each pass
    memory_backed: bool
    facts: dict[str, Any] = field(default_factory=dict)

    def drop_cache(self) -> None:
        drop_pages(self.cache_paths)


def run(spec: Any, config: Any, inv: Any) -> RunOutcome | None:
    target = ct.parse_target(config.target)
    plan = ds.plan_for(config)
    outcomes: list[RunOutcome] = []
    with contextlib.ExitStack() as stack:
        server, env = provision.embedded_s3_for_ranks(stack, target, config.endpoint, plan.disk_bytes(),
                                                      "fewer --samples")

        def body(world: World) -> int:
            outcome = _body(spec, world, config, target, plan, server, inv)
            if outcome is not None:
                outcomes.append(outcome)
            return 0

        provision.ranks_or_here(inv, config.nproc, config.timeout_s, "gloo", env, body)
    return outcomes[0] if outcomes else None


def _body(spec: Any, world: World, config: Any, target: ct.Target, plan: ds.Plan, server: Any,
          inv: Any) -> RunOutcome | None:
    rank = world.rank if world is not None else 0
    bcast = world.broadcast_object if world is not None else (lambda obj: obj)
    name = bcast(f"microbench-dataload-{uuid.uuid4().hex[:12]}" if rank == 0 else None)
    created: list[Any] = []
    if target.kind == "local":
        root = os.path.join(target.path, name)
        source = Source(root=root)
        cache = [os.path.join(root, key) for key in plan.keys()]
        fs = mount_of(target.path)["fstype"]
        facts: dict[str, Any] = {"target_kind": "local", "dataset_dir": root, "filesystem": fs}

        def write() -> None:
            os.mkdir(root)
            created.append(root)
            ds.write_local(plan, root)
    else:
        from ...targets.s3client import preflight

        s3, server_root = provision.s3_target(config.endpoint, server)
        s3.timeout_s = config.timeout_s
        prefix = "/".join(p for p in (target.path.partition("/")[2], name) if p)
        source = Source(bucket=target.bucket, prefix=prefix, s3=s3)
        cache = [os.path.join(server_root, target.bucket, prefix, key) for key in plan.keys()] if server_root else []
        fs = mount_of(server_root)["fstype"] if server_root else "remote"
        facts = {"target_kind": "s3", "s3": s3.describe(), "dataset_prefix": f"s3://{target.bucket}/{prefix}",
                 "filesystem": fs}

        def write() -> None:
            preflight(s3, target.bucket)
            created.append(prefix)
            ds.write_s3(plan, s3.client(pool=8), target.bucket, prefix)
            os.sync()   # the embedded server's files, so their pages can be dropped

    memory = fs in MEMORY_FILESYSTEMS
    facts["cache_drop"] = ("posix_fadvise(DONTNEED) on every file before each pass" if cache else
                           "not dropped (remote S3 server: its cache is out of reach)")
    if memory:
        facts["cache_drop"] += f"; but {fs} is memory, so every read is served from memory"
    facts.update(samples=plan.samples, total_bytes=plan.total_bytes, shards=len(plan.shards),
                 sample_bytes_range=[plan.low, plan.high])
    data = Dataset(plan, source, cache, memory, facts)
    try:
        provision.on_rank0(world, write)
        source.index(plan)
        probe = spec.build(config, provision.Context(world=world, run_dir=data))
        outcome = run_probe(probe, inv.settings, config=config, world=world, json_path=inv.json_path,
                            results_dir=inv.results_dir)
    finally:
        if rank == 0 and created and not config.keep:
            _remove(target, source, created[0])
    if rank != 0:
        return None
    outcome.notes["kept"] = (facts.get("dataset_dir") or facts.get("dataset_prefix")) if config.keep else None
    return outcome


def _remove(target: ct.Target, source: Source, made: str) -> None:
    if target.kind == "local":
        shutil.rmtree(made, ignore_errors=True)
        return
    from ...targets.s3client import delete_prefix

    with contextlib.suppress(Exception):
        delete_prefix(source.client(), target.bucket, made + "/")


def _crowded(rows: list[dict[str, Any]]) -> str | None:
    """A note when some pass ran more worker processes than this machine has CPUs."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    most = max((row["workers"] * row["ranks"] for row in rows), default=0)
    if most <= cpus:
        return None
    return (f"# up to {most} worker processes (workers x ranks) on {cpus} CPUs: past {cpus} they share cores, "
            f"so those rows measure this machine's contention as a trainer here would meet it")


def print_report(outcome: RunOutcome, config: Any) -> str | None:
    from ...core.tables import text_table

    record = outcome.record
    impl = record["implementation"]
    where = impl.get("dataset_prefix") or impl.get("dataset_dir")
    print(f"# microbench dataload: {impl['samples']} samples of {_sizes(config)} as {config.layout}"
          f"{' (' + str(impl['shards']) + ' shards)' if impl.get('shards') else ''} at {where} "
          f"({impl['filesystem']}); {impl['engine']}, {impl['sampler']}")
    s3 = any("s3_requests" in row for row in outcome.rows)
    table = []
    for row in outcome.rows:
        mem = " (memory!)" if row.get("served_from_memory") else ""
        table.append((row["op"], row["workers"], row["ranks"], row["batch_size"], f"{row['samples_per_s']:.0f}{mem}",
                      f"{row['read_gbps']:.3f}{mem}", f"{row['first_batch_s']:.3f}", f"{row['batch_wait_us_p50']:.0f}",
                      f"{row['batch_wait_us_p99']:.0f}")
                     + ((f"{row['s3_requests']:.0f}" if "s3_requests" in row else "-",) if s3 else ())
                     + ("N/A" if row.get("nwrong") is None else row["nwrong"],))
    print(text_table(table, headers=["layout", "workers", "ranks", "batch", "samples/s", "GB/s", "first batch (s)",
                                   "wait p50 (us)", "wait p99 (us)"] + (["S3 GETs"] if s3 else []) + ["#wrong"],
                   tablefmt="simple"))
    print(f"# page cache: {impl['cache_drop']}; rate = all ranks' samples / slowest rank's pass")
    crowded = _crowded(outcome.rows)
    if crowded:
        print(crowded)
    if any(row.get("served_from_memory") for row in outcome.rows):
        print(f"# (memory!): the dataset is on {impl['filesystem']}, memory: these are not storage rates")
    kept = outcome.notes.get("kept")
    print(f"# dataset {'kept at ' + kept if kept else 'removed'}; results: {outcome.path}")
    wrong = sum(r["nwrong"] or 0 for r in outcome.rows)
    return f"{wrong} sample(s) read back wrong (see #wrong)" if wrong else None


def _sizes(config: Any) -> str:
    low, high = config.sample_size
    return format_size(low) if low == high else f"{format_size(low)}-{format_size(high)}"

