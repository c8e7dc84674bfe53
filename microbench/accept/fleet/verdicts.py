"""Verdicts (pure): per node and metric a Line, per node a verdict, and what belongs to the fleet.

Line verdicts: PASS; FAIL (flagged, and even the node's best iteration or run is past the
band's edge; or below a floor in every run); INCONCLUSIVE (flagged, but its range reaches back
into the band: rerun it); FLEET (below a floor that most of its group is below too: counted
once, as the fleet's finding, "floor or environment").

Node verdicts, worst first: MISSING (named in --hosts, no records), FAIL (a line failed),
DRIFT (its fingerprint differs from its group's), PARTIAL (a step partial, skipped, or absent
that most of its group has), INCONCLUSIVE (a line inconclusive), PASS.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ...core.units import format_size
from . import stats
from .metrics import Sample

FAILING = ("MISSING", "FAIL", "DRIFT", "PARTIAL")
ORDER = ("MISSING", "FAIL", "DRIFT", "PARTIAL", "INCONCLUSIVE", "PASS")


@dataclass
class Line:
    node: str
    metric: str
    size_bytes: int | None
    verdict: str
    value: float | None
    median: float | None
    ratio: float | None
    z: float | None
    device: str
    reason: str
    kind: str
    gate: str                  # fleet | sister | floor | pairs
    higher_better: bool = True
    floor: float | None = None     # the acceptance floor of this metric, for the strip plot
    runs: int = 1


@dataclass
class FleetFinding:
    kind: str                  # floor | link | split
    text: str
    nodes: list[str]
    command: str | None = None


@dataclass
class NodeResult:
    node: str
    verdict: str
    group: str | None
    findings: list[str] = field(default_factory=list)
    records: int = 0


def choose_sizes(samples: dict[str, list[Sample]]) -> dict[tuple[str, str], int | None]:
    """Per (metric, position), the one size every node is compared at: the largest that more than
    half of the nodes measured for a bandwidth (least noise, nearest the peak), the smallest for
    a latency; the most common size where no size reaches half."""
    sizes: dict[tuple[str, str], Counter] = {}
    better: dict[tuple[str, str], bool] = {}
    for node_samples in samples.values():
        seen = {(s.metric, s.position, s.size_bytes) for s in node_samples}
        for metric, position, size in seen:
            sizes.setdefault((metric, position), Counter())[size] += 1
        for s in node_samples:
            better[(s.metric, s.position)] = s.higher_better
    out: dict[tuple[str, str], int | None] = {}
    half = len(samples) / 2
    for key, counts in sizes.items():
        common = [s for s, c in counts.items() if c > half] or [max(counts, key=lambda s: (counts[s], s or 0))]
        pick = max if better[key] else min
        out[key] = pick(common, key=lambda s: -1 if s is None else s)
    return out


def merged_values(samples: dict[str, list[Sample]], sizes: dict[tuple[str, str], int | None]
                  ) -> dict[tuple[str, str], dict[str, tuple[float, float, float, int, Sample]]]:
    """(metric, position) -> node -> (value, worst, best, runs, a sample) at the chosen size."""
    out: dict[tuple[str, str], dict[str, list[Sample]]] = {}
    for node, node_samples in samples.items():
        for s in node_samples:
            if sizes.get((s.metric, s.position), "x") == s.size_bytes:
                out.setdefault((s.metric, s.position), {}).setdefault(node, []).append(s)
    merged = {}
    for key, by_node in out.items():
        merged[key] = {node: (*stats.merge_repeats([(s.value, s.worst, s.best) for s in ss], ss[0].higher_better),
                              len(ss), ss[0]) for node, ss in by_node.items()}
    return merged


def metric_label(sample: Sample, size: int | None) -> str:
    where = f" @ {format_size(size)}" if size is not None else ""
    return f"{sample.metric}{where}{' ' + sample.position if sample.position else ''}"


def fleet_lines(group: str, merged: dict, p: float, min_fraction: float) -> list[Line]:
    """The fleet gate at tail probability p, every node of one group on every metric."""
    lines = []
    for _key, by_node in sorted(merged.items()):   # sorted by metric: a stable order of lines
        values = {node: v[0] for node, v in by_node.items()}
        spread = {node: abs(v[2] - v[1]) / 2 for node, v in by_node.items()}
        gates = stats.gate(values, p, min_fraction, next(iter(by_node.values()))[4].higher_better, spread)
        typical = stats.typical_worst({node: v[1] for node, v in by_node.items()})
        for node, (value, _worst, best, runs, sample) in sorted(by_node.items()):
            label = metric_label(sample, sample.size_bytes)
            g = gates.get(node)
            if g is None:
                lines.append(Line(node, label, sample.size_bytes, "PASS", value, None, None, None, sample.device,
                                  "no peer of its kind measured it: floors only", sample.kind, "fleet",
                                  sample.higher_better, runs=runs))
                continue
            verdict = stats.noise_verdict(g, best, sample.higher_better, typical.get(node))
            edge = stats.noise_edge(g, typical.get(node), sample.higher_better)
            lines.append(Line(node, label, sample.size_bytes, verdict, value, g.reference,
                              value / g.reference if g.reference else None, g.z, sample.device,
                              _reason(g, verdict, best, runs, edge, sample.higher_better), sample.kind, "fleet",
                              sample.higher_better, runs=runs))
    return lines


def _reason(g: stats.Gate, verdict: str, best: float, runs: int, edge: float, higher_better: bool) -> str:
    if verdict == "PASS":
        return ""
    side = "below" if higher_better else "above"
    what = f"{100 * g.worse_fraction:.0f}% worse than the median {g.reference:.4g}"
    zs = "z beyond k" if g.z is None or abs(g.z) == float("inf") else f"z {g.z:.1f}"
    span = f"its best of {runs} runs" if runs > 1 else "its best iteration"
    band = (f"the band's edge {g.edge:.4g}" if edge == g.edge else
            f"the peers' typical slowest iteration {edge:.4g} (band's edge {g.edge:.4g})")
    if verdict == "FAIL":
        return f"{what} ({zs}); {span}, {best:.4g}, is still {side} {band}"
    return f"{what} ({zs}), but {span}, {best:.4g}, is within the fleet's band ({band}): rerun"


def sister_lines(node: str, merged: dict, min_fraction: float) -> list[Line]:
    """Like devices of one node (GPUs, NICs, mounts) held against each other on one metric: a
    device worse than the median of its sisters by the minimum fraction, with even its best
    iteration, fails; the verdict names it."""
    by_metric: dict[str, list[tuple[str, tuple]]] = {}
    for (metric, position), by_node in merged.items():
        if position and node in by_node:
            by_metric.setdefault(metric, []).append((position, by_node[node]))
    lines = []
    for _metric, devices in sorted(by_metric.items()):
        if len(devices) < 2:
            continue
        for position, (value, _w, best, runs, sample) in devices:
            others = [v[0] for p, v in devices if p != position]
            ref = stats.median(others)
            g = stats.gate_one(value, others, 0.0, min_fraction, sample.higher_better, ref, 0.0)
            verdict = stats.noise_verdict(g, best, sample.higher_better,
                                          stats.median([v[1] for p, v in devices if p != position]))
            if verdict == "PASS":
                continue
            lines.append(Line(node, f"{metric_label(sample, sample.size_bytes)} vs sister devices", sample.size_bytes,
                              verdict, value, ref, value / ref if ref else None, None, f"{sample.device} ({position})",
                              f"{position} at {100 * value / ref:.0f}% of the median of its {len(others)} sister "
                              f"device(s) on {node}", sample.kind, "sister", sample.higher_better, runs=runs))
    return lines


def floor_lines(
    group_nodes: list[str], floors: dict[str, dict[str, list[Any]]]
) -> tuple[list[Line], list[FleetFinding]]:
    """floors: node -> check label -> CheckResults (one per run). A check that most of the
    group fails is one fleet finding; else each failing node fails it."""
    per_check: dict[str, dict[str, str]] = {}
    results: dict[tuple[str, str], list[Any]] = {}
    for node in group_nodes:
        for label, runs in (floors.get(node) or {}).items():
            statuses = {r.status for r in runs if r.status != "missing"}
            if not statuses:
                continue
            verdict = "PASS" if statuses == {"pass"} else "FAIL" if statuses == {"fail"} else "INCONCLUSIVE"
            per_check.setdefault(label, {})[node] = verdict
            results[(node, label)] = runs
    lines, findings = [], []
    for label, by_node in sorted(per_check.items()):
        failing = sorted(n for n, v in by_node.items() if v == "FAIL")
        fleet_wide = len(failing) > len(by_node) / 2
        if fleet_wide:
            findings.append(
                FleetFinding(
                    "floor",
                    f"{len(failing)} of {len(by_node)} nodes of the group below the floor "
                    f"{label}: floor or environment, not {len(failing)} bad nodes",
                    failing,
                )
            )
        for node, verdict in sorted(by_node.items()):
            runs = results[(node, label)]
            check = runs[0].check
            value = [r.value for r in runs if r.value is not None]
            bound = check.min if check.min is not None else check.max
            shown = "FLEET" if fleet_wide and verdict == "FAIL" else verdict
            reason = "; ".join(dict.fromkeys(r.detail for r in runs)) if verdict != "PASS" else ""
            lines.append(Line(node, f"floor {label}", check.size_bytes, shown, stats.median(value) if value else None,
                              None, None, None, "", reason, "floor", "floor", check.max is None, floor=bound,
                              runs=len(runs)))
    return lines, findings


def node_verdict(lines: list[Line], drifted: list[str], partial: list[str]) -> str:
    verdicts = {line.verdict for line in lines}
    if "FAIL" in verdicts:
        return "FAIL"
    if drifted:
        return "DRIFT"
    if partial:
        return "PARTIAL"
    return "INCONCLUSIVE" if "INCONCLUSIVE" in verdicts else "PASS"


def findings_of(lines: list[Line]) -> list[str]:
    """One phrase per kind of what failed, naming the devices: "memory (host memory (Xeon)) 0.48x"."""
    out = []
    for verdict in ("FAIL", "INCONCLUSIVE"):
        by_kind: dict[str, list[Line]] = {}
        for line in lines:
            if line.verdict == verdict:
                by_kind.setdefault(line.kind, []).append(line)
        for kind, group in by_kind.items():
            devices = ", ".join(dict.fromkeys(line.device for line in group if line.device)) or "-"
            ratios = [line.ratio for line in group if line.ratio is not None]
            at = f", median ratio {stats.median(ratios):.2f}x" if ratios else ""
            out.append(f"{kind} {'failed' if verdict == 'FAIL' else 'inconclusive'} on {devices} "
                       f"({len(group)} metric{'s' if len(group) > 1 else ''}{at})")
    return out
