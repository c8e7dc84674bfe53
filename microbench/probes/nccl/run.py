"""Running the collective probe over a world: the launcher's memory check, NCCL's log for the
transport it really used, the link ceiling (measured or from a `link` record), and the tables
(streamed per size when stdout is not a terminal, as nccl-tests prints)."""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import tempfile
from typing import Any, Callable

from ...core.errors import UsageError
from ...core.jsonfile import load_json
from ...core.units import element_size, format_bytes_human
from ...expect import overrides as expectations
from ...run import provision
from ...run.runner import RunOutcome, SweepSettings, measure_case, run_probe
from ...targets import native
from ...world import backends
from ...world.dist import World
from ...world.launch import detect_world
from ...world.policy import free_memory_bytes, gpu_free_bytes_without_context, in_world, transport_note
from ...world.topology import Topology, machine_ranks, topology
from .groups import check_groups, expected_for_group
from .ops import OPS, effective_size
from .plan import MemoryPlan, Skipped, plan_memory
from .table import CollectiveStream, collective_table, groups_side_by_side

NCCL_LOG_DIR_ENV = "MICROBENCH_NCCL_LOG_DIR"


def run(spec: Any, config: Any, inv: Any) -> RunOutcome | None:
    choice, nccl_log_dir = _nccl_log(backends.choose(config.requested_backend, config.transport))
    link_gbps = link_gbps_from(config.link_result) if config.link_result else None
    placement = inv.placement
    nproc = placement.nproc if placement else config.nproc
    if config.groups and config.groups != ["world"]:
        check_groups(config.groups, topology_before_launch(nproc, placement))
    outcomes: list[RunOutcome] = []

    def before_launch() -> None:
        launcher_memory_check(config, choice.device, nproc)

    def body(world: World) -> int:
        plan = rank_memory_plan(config, choice.device, world)
        probe = spec.build(
            config, provision.Context(world=world, transport=lambda: transport_note(choice, nccl_log_dir))
        )
        probe.memory_plan = plan   # before anything asks for its cases
        expect = expectations.for_collectives(world, config.ops, choice.device, config.expected,
                                              transport=choice.transport)
        probe.expected = expect["expected"]
        if probe.topology is not None:
            # Every rank derives the same from the facts rank 0 broadcast.
            expect["expected_groups"] = probe.expected_groups = {
                g: {op: expected_for_group(expect["expected_facts"], op, g, probe.topology, choice.device,
                                           choice.transport) for op in config.ops}
                for g in probe.groups if g != "world"}
        with inv.named(world):
            ceiling = measure_link_gbps(world, config.timeout_s) if config.measure_link else link_gbps
            # Piped or under srun there is no progress bar: print each size as it finishes instead.
            stream, transport_at_start = None, None
            if world.rank == 0 and not sys.stdout.isatty():
                start_impl = {**native.implementation(), **probe.implementation()}
                transport_at_start = start_impl.get("transport_used")
                print(header_line(world.size, start_impl, config), flush=True)
                stream = CollectiveStream([(c.op, c.size_bytes, c.param("placement"), c.param("group"))
                                           for c in probe.cases()],
                                          element_size(config.dtype), emit=_emit, link_gbps=ceiling,
                                          expected=expect["expected"], expected_groups=expect.get("expected_groups"),
                                          titles=group_titles(probe), skipped=skipped_cells(probe))
            # The table's own lines are the progress here; the generic per-case lines would repeat them.
            settings = dataclasses.replace(inv.settings, progress=False) if stream else inv.settings
            outcome = run_probe(probe, settings, config=config, world=world, json_path=inv.json_path,
                                on_row=stream.on_row if stream else None, results_dir=inv.results_dir,
                                extra_implementation={"backend_reason": choice.reason, **inv.facts},
                                extra_summary={**expect, **({"link_gbps": ceiling,
                                               "link_from": "measured in this run" if config.measure_link
                                               else config.link_result} if ceiling else {})})
        if world.rank == 0:
            outcome.notes.update(streamed=stream is not None, transport_at_start=transport_at_start,
                                 link_gbps=ceiling, skipped_cells=skipped_cells(probe))
            outcomes.append(outcome)
        return 0

    inv.exit_code = in_world(
        nproc=nproc,
        timeout_s=config.timeout_s,
        choice=choice,
        body=body,
        before_launch=before_launch,
        argv=inv.argv,
        per_rank=placement.per_rank if placement else None,
        master_addr=placement.master_addr if placement else "127.0.0.1",
    )
    return outcomes[0] if outcomes else None


def topology_before_launch(nproc: int, placement: Any) -> Topology:
    """The nodes the world will have, known before any rank starts: a launcher's variables, a
    lab's ranks per host, else one node (microbench's own local launch)."""
    spec = detect_world()
    if spec is not None:
        return topology(spec.size)
    if placement is not None:
        return topology(nproc, placement.per_rank(0).env)
    return topology(nproc, {"LOCAL_WORLD_SIZE": str(nproc)})


def group_titles(probe: Any) -> dict[str, str]:
    """What each group's table is called: how many ranks, how many groups at once."""
    return {g.name: (f"group world ({g.size} ranks)" if g.name == "world" else
                     f"group {g.name} ({g.concurrent} groups of {g.size} ranks at once, "
                     f"{'within each node' if g.name == 'node' else 'one rank per node'})")
            for g in probe.groups.values()} if probe.topology is not None else {}


def launcher_memory_check(config: Any, device: str, nproc: int,
                          gpu_free: Callable[[int], list[int] | None] = gpu_free_bytes_without_context) -> None:
    """Before any rank starts (exit 2): refuse a sweep of which nothing fits; which cases fit is
    planned by the ranks (rank_memory_plan). CPU ranks share this host's memory: nproc times one
    rank's need. GPU ranks each have their own GPU: one rank's need against each GPU, read
    through NVML (no CUDA context stays in the launcher); without NVML the ranks check theirs."""
    if device != "cuda":
        plan_memory(config.ops, config.sizes, nproc, free_memory_bytes(device), "host memory", backend=config.backend)
        return
    for index, free in enumerate(gpu_free(nproc) or []):
        plan_memory(config.ops, config.sizes, 1, free, f"GPU memory on GPU {index}", backend=config.backend,
                    world=nproc)


def rank_memory_plan(config: Any, device: str, world: World) -> MemoryPlan:
    """In the world: the cases that fit, from every rank's free memory gathered, so that every
    rank plans the same sweep (a rank that skipped a case alone would leave the others waiting
    in its collective) and refuses alike. The same need as the launcher's check, processes
    included, though they already run: a margin of a few hundred MiB, and a plan that never
    keeps what the launcher would refuse."""
    facts = world.all_gather_object((free_memory_bytes(f"cuda:{torch_current_device()}" if device == "cuda"
                                                       else device), machine_ranks()))
    free = min(f for f, _ in facts)
    if device != "cuda":
        return plan_memory(config.ops, config.sizes, max(local for _, local in facts), free, "host memory",
                           backend=config.backend, world=world.size)
    rank = min(range(len(facts)), key=lambda r: facts[r][0])
    return plan_memory(config.ops, config.sizes, 1, free, f"GPU memory of rank {rank}", backend=config.backend,
                       world=world.size)


def skipped_cells(probe: Any) -> dict[tuple[str, int], dict[str, str]]:
    """(op, size as it runs) -> {placement: why it was skipped} for the tables, from the memory plan."""
    plan = getattr(probe, "memory_plan", None)
    out: dict[tuple[str, int], dict[str, str]] = {}
    if plan is None:
        return out
    for one in plan.skipped:
        op = OPS[one.op]
        for group in probe.groups.values():
            size = effective_size(op, one.size_bytes, group.size, probe.elem,
                                  chunked=op.chunked or probe.config.algo == "ring")
            out.setdefault((one.op, size), {})[one.placement] = (f"needs {format_bytes_human(one.need_bytes)}; "
                                                                   f"{plan.why()}")
    return out


def torch_current_device() -> int:
    import torch

    return torch.cuda.current_device()


def print_outcome(outcome: RunOutcome, config: Any) -> str | None:
    if not outcome.notes.get("streamed"):
        print_report(outcome.record, config, outcome.notes.get("link_gbps"), outcome.notes.get("skipped_cells"))
    elif outcome.record["implementation"].get("transport_used") != outcome.notes.get("transport_at_start"):
        # NCCL names its transport only once it has connected, after the header went out.
        print(f"# transport used: {outcome.record['implementation'].get('transport_used', 'unknown')}")
    if outcome.notes.get("streamed") and outcome.record["summary"].get("groups"):
        print(groups_side_by_side(outcome.rows, outcome.record["summary"]))
    skipped = outcome.record["summary"].get("skipped")
    if skipped:
        print(skipped_line(skipped))
    print(f"# results: {outcome.path}")
    wrong = sum(r["nwrong"] or 0 for r in outcome.rows)
    if wrong:
        return (f"{wrong} wrong element(s) in the results (see the #wrong columns); "
                f"the fabric or the collective library corrupted data")
    return None


def skipped_line(skipped: dict[str, Any]) -> str:
    """The closing line of a run that skipped cases: which, what each needs, and why."""
    cases = [Skipped(c["op"], c["size_bytes"], c["placement"], c["need_bytes"]) for c in skipped["cases"]]
    return (
        f"# skipped {len(cases)} case(s) that do not fit in memory "
        f"({skipped['reason'].removeprefix('does not fit in memory: ')}): "
        f"{'; '.join(c.words() for c in cases)}; every other size and placement ran"
    )


def measure_link_gbps(world: World, timeout_s: float) -> float:
    """The same-run link ceiling: one-way TCP between rank 0 and rank 1 at 64 MiB with the link
    probe, before the sweep, so busbw can be stated as a share of the measured link."""
    from .. import link

    if world.size != 2:
        raise UsageError(f"--measure-link needs exactly 2 ranks (this world has {world.size}); measure the "
                         f"link once with `microbench link` and pass it with --link-result FILE")
    probe = link.LinkProbe(link.Config(sizes=[64 << 20], ops=["uni"], timeout_s=timeout_s), world)
    try:
        (case,) = probe.cases()
        row = measure_case(probe, case, SweepSettings(warmup=1, iters=3, budget_s_per_case=3.0, check=False), world)
    finally:
        probe.close()
    return row["bw_gbps"]


def link_gbps_from(path: str) -> float:
    """The one-way link ceiling (GB/s) from a `microbench link` record."""
    record = load_json(path, what="--link-result", expected="a record written by `microbench link`")
    summary = record.get("summary") if isinstance(record, dict) else None
    gbps = summary.get("link_gbps") if isinstance(summary, dict) else None
    if (record.get("kind") if isinstance(record, dict) else None) != "link" or isinstance(gbps, bool) \
            or not isinstance(gbps, (int, float)) or not math.isfinite(gbps) or gbps <= 0:
        raise UsageError(f"--link-result {path!r} is not a finished `microbench link` record with a uni "
                         f"bandwidth; run e.g. `microbench link --lab NAME --ops uni --json link.json`")
    return float(gbps)


def _nccl_log(choice: backends.BackendChoice) -> tuple[backends.BackendChoice, str | None]:
    """Turn on NCCL's INIT/NET log into a per-run directory: it is the only reliable word on
    which transport NCCL picked. The launcher makes the directory and every rank inherits it;
    a user's own NCCL_DEBUG setting is left alone (the transport is then "unknown")."""
    if choice.backend != "nccl":
        return choice, None
    log_dir = os.environ.get(NCCL_LOG_DIR_ENV)
    if log_dir is None:
        if "NCCL_DEBUG" in os.environ:
            return choice, None
        log_dir = tempfile.mkdtemp(prefix="microbench-nccl-")
    env = {**choice.env, NCCL_LOG_DIR_ENV: log_dir, "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET",
           "NCCL_DEBUG_FILE": os.path.join(log_dir, "nccl.%h.%p.log")}
    return dataclasses.replace(choice, env=env), log_dir


def header_line(ranks: int, impl: dict, config: Any) -> str:
    return (f"# microbench nccl: {ranks} ranks, backend {impl['backend']} on {impl['device']}, "
            f"transport {impl.get('transport_used', 'unknown')}, dtype {config.dtype}, algo {config.algo}, "
            f"implementation {impl['name']}")


def _emit(text: str) -> None:
    print(text, flush=True)


def print_report(record: dict, config: Any, link_gbps: float | None = None,
                 skipped: dict[tuple[str, int], dict[str, str]] | None = None) -> None:
    print(header_line(record["config"]["world"]["size"], record["implementation"], config))
    summary = record["summary"]
    groups = summary.get("groups")
    for op in config.ops:
        for group in (groups or {"world": {}}):
            rows = [r for r in record["rows"] if r["op"] == op and r.get("group", "world") == group]
            if not rows:
                continue
            fits = groups[group]["fits"] if groups else summary.get("fits", {})
            expected = (summary.get("expected", {}) if group == "world"
                        else summary.get("expected_groups", {}).get(group, {}))
            title = None if not groups else f"{op}, group {group} ({_group_words(group, groups[group])})"
            print(collective_table(op, rows, fits.get(op), link_gbps=link_gbps if group == "world" else None,
                                   expected=expected.get(op), title=title,
                                   skipped={size: cells for (name, size), cells in (skipped or {}).items()
                                            if name == op}))
            print()
    if groups:
        print(groups_side_by_side(record["rows"], summary))
        print()


def _group_words(group: str, info: dict[str, Any]) -> str:
    if group == "world":
        return f"{info['ranks']} ranks"
    where = "within each node" if group == "node" else "one rank per node"
    return f"{info['groups_at_once']} groups of {info['ranks']} ranks at once, {where}"
