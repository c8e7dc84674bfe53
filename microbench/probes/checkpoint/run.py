"""Running the checkpoint probe: the launcher's checks and embedded S3 server, the ranks' shared
run directory, and the table."""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

from ...core.errors import UsageError
from ...core.units import format_size, memory_shortfall
from ...run import provision
from ...run.runner import RunOutcome, run_probe
from ...targets import checkpoint_target as ct
from ...targets.mount import facts as mount_facts
from ...world import backends
from ...world.dist import World
from ...world.launch import check_local_world, detect_world
from ...world.policy import free_memory_bytes, in_world
from .config import full_host_bytes, host_bytes_per_rank


def run(spec: Any, config: Any, inv: Any) -> RunOutcome | None:
    target = ct.parse_target(config.target)
    choice = backends.choose(config.requested_backend)
    outcomes: list[RunOutcome] = []
    with contextlib.ExitStack() as stack:
        if detect_world() is None:
            check_local_world(config.nproc)  # before the memory check, which scales with nproc
            choice = _preflight(stack, config, target, choice)

        def body(world: World) -> int:
            outcome = _body(spec, world, config, target, inv)
            if outcome is not None:
                outcomes.append(outcome)
            return 0

        inv.exit_code = in_world(
            nproc=config.nproc, timeout_s=config.timeout_s, choice=choice, body=body, argv=inv.argv
        )
    return outcomes[0] if outcomes else None


def _preflight(stack: contextlib.ExitStack, config: Any, target: ct.Target,
               choice: backends.BackendChoice) -> backends.BackendChoice:
    """Checks the launching process makes once, before spawning ranks: memory, the target, and
    for s3:// without --endpoint the embedded server the ranks will use."""
    nproc = config.nproc
    full = config.state_dict == "full"
    if choice.device == "cpu" or full:
        # Every rank on this node is on rank 0's node: with --state-dict full rank 0 also holds
        # the whole gathered state (cpu_offload), from GPUs too.
        need = host_bytes_per_rank(config.size_bytes, nproc, config.async_save) * nproc if choice.device == "cpu" else 0
        need += full_host_bytes(config.size_bytes, config.save_format) if full else 0
        shortfall = memory_shortfall(need, free_memory_bytes("cpu"), "host memory")
        if shortfall:
            what = (f"--state-dict full gathers the whole {format_size(config.size_bytes)} state into rank 0's host "
                    f"memory: it" if full else f"--size {format_size(config.size_bytes)} over {nproc} ranks")
            raise UsageError(f"{what} {shortfall}; use a smaller --size" + (" or --state-dict sharded" if full else ""))
    if target.kind == "local":
        mount_facts.check_alive(target.path)   # a dead bucket mount: one line, not a hang
        ct.preflight_local(target, config.size_bytes)
        return choice
    from ...targets.s3client import check_profile

    check_profile()
    if config.endpoint:
        ct.check_endpoint_reachable(config.endpoint)
        access = ct.S3Access(config.endpoint, timeout_s=config.timeout_s)
        probe_dir = ct.RunDir(target, ct.unique_name(), access)
        probe_dir.create()  # the bucket exists and the credentials work
        return choice
    server = provision.embedded_s3(stack, target.bucket, ct.required_bytes(config.size_bytes), "a smaller --size")
    return dataclasses.replace(choice, env={**choice.env, **provision.embedded_s3_env(server)})


def _s3_access(config: Any) -> ct.S3Access:
    if config.endpoint:
        return ct.S3Access(config.endpoint, timeout_s=config.timeout_s)
    server = provision.embedded_s3_from_env()
    if server is None:
        raise UsageError("an s3:// target under torchrun/srun/mpirun needs --endpoint URL (the embedded server is "
                         "only started for ranks microbench spawns itself)")
    return ct.S3Access(server["endpoint"], server["key"], server["secret"], embedded=True, root_dir=server["root"])


def _body(spec: Any, world: World, config: Any, target: ct.Target, inv: Any) -> RunOutcome | None:
    access = _s3_access(config) if target.kind == "s3" else None
    run_dir = provision.shared_run_dir(world, target, access, ct.required_bytes(config.size_bytes), "the checkpoint")
    try:
        if config.device == "cuda":
            need = host_bytes_per_rank(config.size_bytes, world.size, False)
            shortfall = memory_shortfall(need, free_memory_bytes("cuda"), "GPU memory per rank")
            if shortfall:
                raise UsageError(f"--size {format_size(config.size_bytes)} over {world.size} ranks {shortfall}; "
                                 f"use a smaller --size or more ranks")
        probe = spec.build(config, provision.Context(world=world, run_dir=run_dir))
        outcome = run_probe(probe, inv.settings, config=config, world=world, json_path=inv.json_path,
                            results_dir=inv.results_dir)
    finally:
        if world.rank == 0 and not config.keep:
            run_dir.remove()
    if world.rank != 0:
        return None
    outcome.record["implementation"]["run_dir"] = run_dir.display if config.keep else f"{run_dir.display} (removed)"
    return outcome


def blocked_parts(rows: list[dict[str, Any]], device: str | None = "cpu") -> str:
    """What async_save's blocking part spent its time on: DCP's staging copy of each rank's shard
    into CPU memory (making the staged tensors, copying into them) and the rest (planning,
    starting the writer thread), beside a synchronous save's time."""
    by_op = {row["op"]: row for row in rows}
    row, save = by_op.get("async_save", {}), by_op.get("save", {})
    blocked_ms = row.get("blocked_time_us", 0.0) / 1e3
    if "staging_time_us" not in row:
        return (f"# async_save blocked {blocked_ms:.1f} ms; its staging copy was not timed (DCP's own stager, "
                f"not the writer's)")
    staging_ms = row["staging_time_us"] / 1e3
    steps = ""
    if "staging_make_time_us" in row and "staging_copy_time_us" in row:
        make_ms, copy_ms = row["staging_make_time_us"] / 1e3, row["staging_copy_time_us"] / 1e3
        # torch's _create_cpu_state_dict deep-copies a DTensor already on the CPU, data included,
        # before it allocates the buffer the copy goes to: the shard is moved twice.
        made = ("deep-copying each DTensor, data included, then allocating its buffer" if device == "cpu"
                else "copying each tensor to the host and allocating its buffer")
        steps = f" ({make_ms:.1f} ms making the staged tensors: {made}; {copy_ms:.1f} ms copying into them)"
    line = (f"# async_save blocked {blocked_ms:.1f} ms: {staging_ms:.1f} ms staging each rank's "
            f"{format_size(row['bytes_per_rank'])} into CPU memory{steps}, "
            f"{max(blocked_ms - staging_ms, 0.0):.1f} ms the rest (planning, starting the writer thread)")
    save_ms = save.get("time_us", {}).get("p50", 0.0) / 1e3
    if save_ms and blocked_ms > save_ms:
        line += f"; a synchronous save took {save_ms:.1f} ms, writing each byte once to the page cache"
    return line


def print_report(outcome: RunOutcome, config: Any) -> str | None:
    from ...core.tables import text_table

    record = outcome.record
    impl = record["implementation"]
    world = record["config"]["world"]
    where = impl.get("s3_endpoint", "")
    if impl.get("s3_embedded_server"):
        where = "embedded S3 server (rclone serve s3)"
    kind = ("full state dict gathered to rank 0, " + ("torch.save" if impl.get("save_format") == "torch"
                                                       else "safetensors") + " by one process"
            if impl.get("state_dict_type") == "full" else "sharded state dict, DCP save by every rank")
    print(f"# microbench checkpoint: {world['size']} ranks, backend {impl['backend']} on {impl['device']}, "
          f"{impl['state_dict']}, {config.dtype}; {kind}")
    print(f"# target {config.target}{' via ' + where if where else ''}; storage {impl['storage']}; "
          f"durable = {impl['durable_when']}")
    if impl.get("on_mount"):
        print(f"# bucket mount {impl['mount_point']} ({impl['mount_mode']}) on {impl['backing_store']}; rclone "
              f"{impl['rclone_version']}")
    durable = any("durable_time_us" in row for row in record["rows"])
    table = []
    for row in record["rows"]:
        gbps = row.get("write_gbps", row.get("read_gbps"))
        blocked = f"{row['blocked_time_us'] / 1e3:.1f}" if "blocked_time_us" in row else "-"
        wrong = "N/A" if row.get("nwrong") is None else row["nwrong"]
        if row.get("checked_by"):
            wrong = f"{'not checked' if row.get('nwrong') is None else row['nwrong']} (by {row['checked_by']})"
        table.append(
            (
                row["op"],
                format_size(row["size_bytes"]),
                format_size(row["bytes_per_rank"]),
                row["iters"],
                f"{row['time_us']['p50'] / 1e3:.1f}",
                f"{row['time_us']['max'] / 1e3:.1f}",
                blocked,
                f"{gbps:.3f}",
                wrong,
            )
            + ((f"{row['durable_time_us'] / 1e3:.1f}" if "durable_time_us" in row else "-",) if durable else ())
        )
    print(text_table(table, headers=["op", "total", "per rank", "iters", "time p50 (ms)", "max (ms)",
                                   "blocked (ms)", "GB/s", "#wrong"] + (["durable (ms)"] if durable else []),
                   tablefmt="simple"))
    if durable:
        # A mount's durable time is the store's word; any other target's is the async save's own
        # end (its files fsynced or its objects uploaded), so the footnote names which.
        until = ("the store held every byte, polled over S3" if impl.get("on_mount")
                 else f"the save's future completed ({impl['durable_when']})")
        print(f"# blocked = until the save call returned on every rank (what training waits for); durable = until "
              f"{until} (median per save)")
    summary = record.get("summary", {})
    if "async_blocked_fraction" in summary:
        print(f"# async_save: training blocked for {100 * summary['async_blocked_fraction']:.0f}% of the time "
              f"until the checkpoint was durable")
        print(blocked_parts(record["rows"], impl.get("device")))
    parts = {row["op"]: row for row in record["rows"] if "gather_time_us" in row or "read_time_us" in row}
    if parts:
        save, load = parts.get("save", {}), parts.get("load", {})
        ms = lambda row, key: f"{row[key] / 1e3:.1f} ms" if key in row else "-"
        print(f"# full save parts (rank 0, median): gather {ms(save, 'gather_time_us')}, serialize+write "
              f"{ms(save, 'serialize_write_time_us')}, fsync {ms(save, 'fsync_time_us')}; load: read "
              f"{ms(load, 'read_time_us')}, scatter {ms(load, 'scatter_time_us')}")
    print(f"# time = slowest rank; GB/s = total bytes / time (1e9 B/s); page cache before load: "
          f"{summary.get('page_cache_before_load', 'n/a')}")
    if any(row.get("checked_by") for row in record["rows"]):
        print("# #wrong (by load): the load case read the save's last checkpoint and checked every element")
    print(f"# results: {outcome.path}")
    wrong = sum(r["nwrong"] or 0 for r in outcome.rows if "checked_by" not in r)  # counted once, by the load
    if wrong:
        return (f"{wrong} wrong element(s) after loading the checkpoint (see #wrong); the storage or DCP "
                f"returned different bytes than were saved")
    return None
