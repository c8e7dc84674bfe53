"""The fleet, analysed: records gathered -> nodes and their fingerprints -> peer groups and
drift -> per group and metric the floors and the fleet gate, per node its sister devices ->
pair results attributed -> a verdict per node, fleet-wide findings, and what each failed node
costs a job. Each record is read once and reduced to what the analysis needs (its samples,
fingerprint, floor results), so memory grows with nodes x metrics, not with record sizes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...core import registry
from ...core.errors import UsageError
from .. import rules
from . import cost as costs, gather, groups, metrics, pairs as pairmod, stats, verdicts
from .config import Config
from .verdicts import FleetFinding, Line, NodeResult


@dataclass
class NodeData:
    """What the analysis keeps of one node's records."""
    node: str
    print: groups.NodePrint
    samples: list[metrics.Sample] = field(default_factory=list)
    floors: dict[str, list[Any]] = field(default_factory=dict)   # check label -> CheckResult per run
    steps: dict[str, list[tuple[str, str | None]]] = field(default_factory=dict)   # step -> (status, reason)
    disks: dict[str, str] = field(default_factory=dict)
    nics: list[dict[str, Any]] = field(default_factory=list)
    tflops: list[float] = field(default_factory=list)
    records: int = 0


@dataclass
class Analysis:
    config: Config
    expected: list[str] | None
    nodes: dict[str, NodeResult]
    lines: list[Line]
    findings: list[FleetFinding]
    groups: list[groups.Group]
    k: float
    tests: int
    notes: list[str]
    costs: list[costs.Cost]
    inventory: gather.Inventory
    pair_reference: float | None = None

    @property
    def failed(self) -> list[str]:
        return [n for n, r in self.nodes.items() if r.verdict in verdicts.FAILING]

    @property
    def drain(self) -> list[str]:
        return [n for n, r in self.nodes.items() if r.verdict in ("FAIL", "DRIFT")]

    @property
    def rerun(self) -> list[str]:
        return [n for n, r in self.nodes.items() if r.verdict in ("MISSING", "PARTIAL", "INCONCLUSIVE")]


def check_label(check: rules.Check) -> str:
    bound = (f">= {100 * check.min_fraction_of_expected:.0f}% of expected" if check.min_fraction_of_expected is not None
             else f">= {check.min:g}" if check.min is not None else f"<= {check.max:g}")
    return f"{check.step} {check.op} {check.metric or '(primary)'} {bound}"


def _read(
    config: Config, checks: list[rules.Check]
) -> tuple[dict[str, NodeData], list[tuple[str, dict]], gather.Inventory]:
    inventory = gather.Inventory(list(config.sources))
    nodes: dict[str, NodeData] = {}
    pair_docs: list[tuple[str, dict]] = []
    for doc in gather.documents(config.sources, config.endpoint, inventory):
        record = doc.record
        if gather.is_pair_source(record):
            pair_docs.append((doc.location, record))
            inventory.pairs.append(doc.location)
            continue
        node = gather.node_of(doc)
        if registry.for_record(record) is None or node is None:
            why = "no host name in its environment" if node is None else f"a {record.get('kind')!r} record, no probe's"
            inventory.set_aside.append(f"{doc.location}: {why}")
            continue
        inventory.node_records += 1
        data = nodes.setdefault(node, NodeData(node, groups.NodePrint(node)))
        step = gather.step_of(doc)
        data.records += 1
        data.print.add(groups.flat_fingerprint(record.get("environment") or {}))
        data.steps.setdefault(step, []).append((str(record.get("status")), record.get("status_reason")))
        data.samples += metrics.samples(step, record)
        disk = metrics.disk_of(record)
        if disk:
            data.disks[disk[0]] = disk[1]
        env = record.get("environment") or {}
        if not data.nics and isinstance(env.get("nics"), list):
            data.nics = [n for n in env["nics"] if isinstance(n, dict)]
        achieved = (record.get("summary") or {}).get("achieved_tflops")
        if metrics.kind_of(record.get("kind", "")) == "compute" and isinstance(achieved, (int, float)) and achieved > 0:
            data.tflops.append(float(achieved))
        mine = [c for c in checks if registry.step_key(c.step) == registry.step_key(step)]
        for check, result in zip(mine, rules.evaluate(mine, {step: record}), strict=False):
            data.floors.setdefault(check_label(check), []).append(result)
    return nodes, pair_docs, inventory


def _match_names(expected: list[str], data: dict[str, NodeData], notes: list[str]) -> None:
    """A node whose records carry its full name (n17.cluster.local) where --hosts has the short
    one (n17, as `scontrol show hostnames` prints it) is that node, and the other way round."""
    renamed = []
    for found in sorted(data):
        if found in expected:
            continue
        match = [e for e in expected if e not in data and (e == found.split(".")[0] or found == e.split(".")[0])]
        if len(match) == 1:
            data[match[0]] = data.pop(found)
            data[match[0]].node = match[0]
            renamed.append(f"{found} as {match[0]}")
    if renamed:
        notes.append(f"host names matched to --hosts by their first label: {', '.join(renamed[:5])}"
                     + (", ..." if len(renamed) > 5 else ""))


def _group_note(group: groups.Group, p: float) -> str:
    n = len(group.nodes)
    if n == 1:
        return f"group {group.name}: one node ({group.nodes[0]}), no peers: floors only"
    k = stats.group_k(p, n)
    shown = "inf" if k == float("inf") else f"{k:.2f}"
    if n < stats.SMALL_FLEET:
        return (
            f"group {group.name}: {n} nodes, under {stats.SMALL_FLEET}: the floors and each node against the median "
            f"of the other {n - 1} (leave one out); k = {shown} (Student t, {n - 2} degrees of freedom)"
        )
    return f"group {group.name}: {n} nodes; k = {shown} (Student t, {n - 1} degrees of freedom)"


def _partial(group: groups.Group, nodes: dict[str, NodeData]) -> dict[str, list[str]]:
    """Per node, the steps it lacks or did not finish that most of its group finished."""
    out: dict[str, list[str]] = {}
    complete: dict[str, int] = {}
    for node in group.nodes:
        for step, runs in nodes[node].steps.items():
            if any(status == "complete" for status, _ in runs):
                complete[step] = complete.get(step, 0) + 1
    for node in group.nodes:
        for step, count in sorted(complete.items()):
            if count <= len(group.nodes) / 2:
                continue
            ran = nodes[node].steps.get(step)
            if not ran:
                out.setdefault(node, []).append(f"no {step} record ({count} of {len(group.nodes)} nodes have one)")
            elif not any(status == "complete" for status, _ in ran):
                status, reason = ran[-1]
                out.setdefault(node, []).append(f"{step} {status}" + (f": {reason}" if reason else "")
                                                + f" (complete on {count} of {len(group.nodes)})")
    return out


def _nic_label(node: NodeData, address: str | None) -> str | None:
    for nic in node.nics:
        if address and address in (nic.get("addresses") or []):
            speed = f", {nic['speed_mbps']} Mb/s" if nic.get("speed_mbps") else ""
            return f"NIC {nic.get('name')} ({nic.get('model') or nic.get('link') or '?'}{speed}, {address})"
    return None


def analyse(config: Config) -> Analysis:
    checks = rules.load_checks(config.accept) if config.accept else []
    expected = gather.read_hosts(config.hosts) if config.hosts else None
    gather.check_sources(config.sources)
    data, pair_docs, inventory = _read(config, checks)
    notes: list[str] = []
    if not data:
        kinds = f"; set aside: {'; '.join(inventory.set_aside[:3])}" if inventory.set_aside else ""
        raise UsageError(f"no suite records of any node under {', '.join(map(repr, config.sources))} "
                         f"({inventory.files} JSON file(s){kinds}); {gather.EXAMPLE}")
    if expected is not None:
        _match_names(expected, data, notes)
        if not set(expected) & set(data):
            raise UsageError(f"--hosts {config.hosts!r} names {len(expected)} node(s) ({', '.join(expected[:4])}"
                             f"{', ...' if len(expected) > 4 else ''}) and none has records here; found "
                             f"{', '.join(sorted(data)[:6])}{', ...' if len(data) > 6 else ''}")
        extra = sorted(set(data) - set(expected))
        if extra:
            notes.append(f"records of {len(extra)} node(s) not in --hosts, analysed anyway: {', '.join(extra[:10])}")
    repeated = {n: [s for s, runs in d.steps.items() if len(runs) > 1] for n, d in data.items()}
    for node, steps in sorted(repeated.items()):
        if steps:
            notes.append(f"{node}: {len(steps)} step(s) with more than one record ({', '.join(steps[:4])}): kept as "
                         f"repeats (the median, and the range of every run)")
    prints = {n: d.print for n, d in data.items()}
    peer = groups.peer_groups(prints)
    pair_set = pairmod.collect(pair_docs)
    for node, samples in pair_set.node_samples.items():
        if node in data:
            data[node].samples += samples
    notes += [f"not attributed: {why}" for why in pair_set.unattributed]
    # Every node-metric the fleet gate tests, and every directed pair: the budget spreads over all.
    per_group = []
    for group in peer:
        resolved = {n: metrics.resolve_devices(data[n].samples, data[n].disks) for n in group.nodes}
        per_group.append((group, verdicts.merged_values(resolved, verdicts.choose_sizes(resolved))))
    tests = sum(len(by_node) for _, merged in per_group for by_node in merged.values()) + len(pair_set.values)
    try:
        p = stats.tail_for_budget(config.budget, tests)
        k = stats.k_for_budget(config.budget, tests)
    except ValueError as exc:
        raise UsageError(f"invalid --budget {config.budget:g}: {exc}; expected fewer false flags than half the "
                         f"{tests} node-metrics, e.g. --budget 1") from None
    lines: list[Line] = []
    findings: list[FleetFinding] = []
    drifted: dict[str, list[str]] = {}
    partial: dict[str, list[str]] = {}
    for group, merged in per_group:
        notes.append(_group_note(group, p))
        lines += verdicts.fleet_lines(group.name, merged, p, config.min_fraction)
        for node in group.nodes:
            lines += verdicts.sister_lines(node, merged, config.min_fraction)
        floor_lines, floor_findings = verdicts.floor_lines(group.nodes, {n: data[n].floors for n in group.nodes})
        lines += floor_lines
        findings += floor_findings
        node_drift, split = groups.drift(group, prints)
        drifted.update(node_drift)
        findings += [FleetFinding("split", text, group.nodes) for text in split]
        partial.update(_partial(group, data))
    pair_reference = None
    if pair_set.values:
        nic_of = {n: label for n in data if (label := _nic_label(data[n], pair_set.addresses.get(n)))}
        pair_k = stats.k_for_peers(p, len(pair_set.values))
        notes.append(f"pairs: {len(pair_set.values)} directed pairs, k = {pair_k:.2f}")
        judged = pairmod.judge(pair_set, pair_k, config.min_fraction, nic_of)
        lines += judged.lines
        findings += judged.links
        pair_reference = judged.reference
        strangers = sorted(set(pair_set.nodes) - set(data))
        if strangers:
            notes.append(
                f"pair records name {len(strangers)} node(s) without suite records: {', '.join(strangers[:10])}"
            )
    _draw_floors(lines, checks)
    results = _node_results(expected, data, lines, drifted, partial, peer)
    group_costs = []
    for group in peer:
        job = costs.job_for(config.model, group.nodes, prints, {n: stats.median(data[n].tflops)
                                                                for n in group.nodes if data[n].tflops}, pair_reference)
        for node in group.nodes:
            if results[node].verdict == "FAIL":
                group_costs += costs.price(job, node, [line for line in lines if line.node == node])
    return Analysis(config, expected, results, lines, findings, peer, k, tests, notes, group_costs, inventory,
                    pair_reference)


def _draw_floors(lines: list[Line], checks: list[rules.Check]) -> None:
    """Each fleet line learns the floor (or ceiling) a check puts on its step, op and metric,
    for the strip plot to draw."""
    for check in checks:
        bound = check.min if check.min is not None else check.max
        if bound is None:
            continue
        head = f"{registry.step_key(check.step)} {check.op}"
        measured: dict[str, Line] = {}
        for line in lines:
            words = line.metric.split(" @ ")[0].split()
            if (
                line.gate == "fleet"
                and line.metric.startswith(head + " ")
                and (not check.metric or check.metric in words)
            ):
                line.floor = bound
                measured.setdefault(line.node, line)
        for line in lines:
            if line.gate == "floor" and line.metric == f"floor {check_label(check)}" and line.node in measured:
                line.device, line.kind = measured[line.node].device, measured[line.node].kind


def _node_results(expected: list[str] | None, data: dict[str, NodeData], lines: list[Line],
                  drifted: dict[str, list[str]], partial: dict[str, list[str]],
                  peer: list[groups.Group]) -> dict[str, NodeResult]:
    group_of = {n: g.name for g in peer for n in g.nodes}
    by_node: dict[str, list[Line]] = {}
    for line in lines:
        by_node.setdefault(line.node, []).append(line)
    out: dict[str, NodeResult] = {}
    for node in list(expected or []) + sorted(n for n in data if n not in (expected or [])):
        if node not in data:
            out[node] = NodeResult(node, "MISSING", None, ["no records from this node"])
            continue
        mine = by_node.get(node, [])
        verdict = verdicts.node_verdict(mine, drifted.get(node, []), partial.get(node, []))
        findings = (verdicts.findings_of(mine) + [f"drift: {d}" for d in drifted.get(node, [])]
                    + [f"partial: {p}" for p in partial.get(node, [])])
        out[node] = NodeResult(node, verdict, group_of.get(node), findings, data[node].records)
    return out
