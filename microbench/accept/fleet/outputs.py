"""The fleet's outputs: the table on stdout, the fleet record, JUnit XML, the drain and rerun
lists (text: pure; the writing is run.py's).

The fleet record is a record like any other (schema v2, kind "fleet"), its rows one per node and
metric: node, metric, value, the group's median, ratio, z, verdict, reason, device. Its summary
carries `fleet_schema_version` (the layout of those rows and of the summary), the nodes'
verdicts and findings, the fleet-wide findings, k and what it was computed from, and the costs.
"""

from __future__ import annotations

import math
import platform
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import asdict
from typing import Any

from tabulate import tabulate

from ... import __version__
from ...core.options import recorded
from ...results import new_record
from ...results.schema import utc_now
from .analysis import Analysis
from .verdicts import ORDER, Line

FLEET_SCHEMA_VERSION = 1


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def _num(value: float | None) -> str:
    if value is None:
        return "-"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return f"{value:.4g}"


def line_row(line: Line) -> dict[str, Any]:
    row = {"op": line.gate, **vars(line)}
    row["z"] = _finite(line.z)
    if line.z is not None and not math.isfinite(line.z):
        row["z_note"] = "the peers are identical (MAD 0): the minimum fraction decides"
    return row


def record(analysis: Analysis, argv: list[str] | None = None) -> dict[str, Any]:
    """The fleet record, complete, for a RecordWriter."""
    config = recorded(analysis.config)
    environment = {"hostname": platform.node(), "python": platform.python_version(), "microbench": __version__}
    implementation = {"name": "python", "engine": "microbench.accept.fleet",
                      "statistics": "robust z = (x - median) / (1.4826 MAD) within a peer group; under 8 nodes the "
                                    "median and MAD of the other nodes; noise: compare's per-iteration range"}
    out = new_record("fleet", config, environment, implementation, argv)
    out["rows"] = [line_row(line) for line in analysis.lines]
    out["summary"] = summary(analysis)
    # Complete as written: the writer's first write is its only one (35,000 rows at 1,000 nodes).
    out.update(status="complete", ended_at=utc_now())
    return out


def summary(analysis: Analysis) -> dict[str, Any]:
    counts = Counter(r.verdict for r in analysis.nodes.values())
    return {
        "fleet_schema_version": FLEET_SCHEMA_VERSION,
        "verdicts": {v: counts[v] for v in ORDER if counts[v]},
        "nodes": {n: {"verdict": r.verdict, "group": r.group, "findings": r.findings, "records": r.records}
                  for n, r in analysis.nodes.items()},
        "expected": analysis.expected,
        "k": _finite(analysis.k), "tests": analysis.tests, "budget": analysis.config.budget,
        "min_fraction": analysis.config.min_fraction,
        "groups": [{"name": g.name, "nodes": g.nodes} for g in analysis.groups],
        "findings": [asdict(f) for f in analysis.findings],
        "costs": [asdict(c) for c in analysis.costs],
        "notes": analysis.notes,
        "pair_reference_gbps": analysis.pair_reference,
        "drain": analysis.drain, "rerun": analysis.rerun,
        "sources": analysis.inventory.sources, "files": analysis.inventory.files,
        "node_records": analysis.inventory.node_records, "set_aside": analysis.inventory.set_aside,
    }


def header(analysis: Analysis) -> list[str]:
    inv = analysis.inventory
    expected = f"{len(analysis.expected)} expected (--hosts), " if analysis.expected is not None else ""
    found = sum(1 for r in analysis.nodes.values() if r.verdict != "MISSING")
    metrics = len({line.metric for line in analysis.lines if line.gate == "fleet"})
    out = [f"# microbench fleet: {expected}{found} node(s) with records in {len(analysis.groups)} peer group(s); "
           f"{inv.node_records} records, {metrics} metrics; {len(inv.pairs)} pair record(s)"]
    k = "inf" if math.isinf(analysis.k) else f"{analysis.k:.2f}"
    out.append(
        f"# fleet gate: robust z (1.4826 MAD) within a peer group; flagged when |z| > k and at least "
        f"{100 * analysis.config.min_fraction:g}% worse than the median; k from a budget of "
        f"{analysis.config.budget:g} false flag(s) per run over {analysis.tests} tests (node-metrics and pairs), "
        f"held in 95% of healthy runs: k = {k} for a large group, larger for a small one (below)"
    )
    if not analysis.config.accept:
        out.append("# floors: none (no --accept): the fleet gate only")
    if analysis.expected is None:
        out.append("# no --hosts: the nodes expected are the nodes found, so none can be MISSING")
    out += [f"# {note}" for note in analysis.notes]
    if inv.set_aside:
        out.append(f"# set aside {len(inv.set_aside)} file(s): {'; '.join(inv.set_aside[:3])}"
                   + ("; ..." if len(inv.set_aside) > 3 else ""))
    return out


def table(analysis: Analysis) -> str:
    """Every line that is not PASS: node, verdict, metric, value, group median, ratio, z, device."""
    shown = [line for line in analysis.lines if line.verdict != "PASS"]
    order = {v: i for i, v in enumerate(ORDER + ("FLEET",))}
    shown.sort(key=lambda line: (line.node, order.get(line.verdict, 9), line.kind, line.metric))
    rows = [(line.node, line.verdict, line.metric, _num(line.value), _num(line.median),
             "-" if line.ratio is None else f"{line.ratio:.2f}", _num(line.z), line.device or "-") for line in shown]
    return tabulate(rows, headers=["node", "verdict", "metric", "value", "median", "ratio", "z", "device"],
                    tablefmt="simple", disable_numparse=True) if rows else "# every metric of every node passed"


def node_table(analysis: Analysis) -> str:
    rows = [(n, r.verdict, r.group or "-", "; ".join(r.findings) or "-") for n, r in analysis.nodes.items()]
    return tabulate(rows, headers=["node", "verdict", "group", "findings"], tablefmt="simple", disable_numparse=True)


def closing(analysis: Analysis) -> list[str]:
    out = [f"FLEET-WIDE {f.kind}: {f.text}" + (f"; to bisect: {f.command}" if f.command else "")
           for f in analysis.findings]
    if analysis.costs:
        out.append(f"# cost per failed node ({analysis.config.model}, the composer):")
        out += [f"  {c.text}" for c in analysis.costs]
    return out


def junit(analysis: Analysis) -> str:
    """A testsuite per node, a testcase per metric; a testsuite `fleet` for fleet-wide findings."""
    root = ET.Element("testsuites", name="microbench")
    by_node: dict[str, list[Line]] = {}
    for line in analysis.lines:
        by_node.setdefault(line.node, []).append(line)
    for node, result in analysis.nodes.items():
        suite = ET.SubElement(root, "testsuite", name=f"fleet.{node}", hostname=node)
        failures = skipped = tests = 0
        cases = [(line.metric, line.verdict, line.reason, line.value) for line in by_node.get(node, [])]
        if result.verdict == "MISSING":
            cases.append(("records", "FAIL", "no records from this node", None))
        cases += [("fingerprint", "FAIL", f, None) for f in result.findings if f.startswith("drift: ")]
        cases += [("steps", "FAIL", f, None) for f in result.findings if f.startswith("partial: ")]
        for name, verdict, reason, value in cases:
            tests += 1
            case = ET.SubElement(suite, "testcase", classname=f"microbench.fleet.{node}", name=name, time="0")
            if verdict == "FAIL":
                failures += 1
                ET.SubElement(case, "failure", message=reason or "failed", type="FleetFailure")
            elif verdict in ("INCONCLUSIVE", "FLEET"):
                skipped += 1
                ET.SubElement(case, "skipped", message=f"{verdict.lower()}: {reason}")
            elif value is not None:
                ET.SubElement(case, "system-out").text = _num(value)
        suite.set("tests", str(tests))
        suite.set("failures", str(failures))
        suite.set("skipped", str(skipped))
        suite.set("errors", "0")
    if analysis.findings:
        fleet = ET.SubElement(root, "testsuite", name="fleet", tests=str(len(analysis.findings)),
                              failures=str(len(analysis.findings)), skipped="0", errors="0")
        for finding in analysis.findings:
            case = ET.SubElement(fleet, "testcase", classname="microbench.fleet", name=finding.kind, time="0")
            ET.SubElement(case, "failure", message=finding.text, type="FleetWide")
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def node_list(nodes: list[str]) -> str:
    return "".join(f"{n}\n" for n in nodes)
