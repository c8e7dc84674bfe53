"""Results measured between nodes, attributed to nodes (pure): `hunt`'s every-pair matrix,
`link` records between two hosts, and `nccl --groups` records across nodes, whose node groups
(each node's own ranks, all nodes at once) give every node its own collective figure: the
slowest of its ranks' medians, as a sample of that node beside its suite's. Their cross-node
groups span every node at once and name none; hunt's pairs do.

A directed pair (src -> dst) is slow when the fleet gate flags it against all directed pairs
(robust z past k and at least the minimum fraction below the median). A node is bad only when
it is slow with at least two different partners, partners not explained already: the node slow
with the most of its partners is taken first, its pairs set aside, and the rest looked at again,
so a healthy node whose only slow partners are two bad nodes is not blamed. A slow pair whose two
ends are fine with everyone else is a link finding, with the `hunt` command that tells a bad
link from a bad host (all pairs again, or the pair and a healthy third host).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from ...core.jsonfile import json_object
from . import stats
from .metrics import Sample
from .verdicts import FleetFinding, Line

_LAB_HOST = re.compile(r"-(h\d+) \(")


@dataclass
class PairSet:
    """Directed values from every pair record: (src, dst) -> [GB/s per record]."""
    values: dict[tuple[str, str], list[float]] = field(default_factory=dict)
    addresses: dict[str, str] = field(default_factory=dict)     # node -> address its peers reached
    labs: set[str] = field(default_factory=set)
    sources: list[str] = field(default_factory=list)
    metric: str = "bw_gbps"
    node_samples: dict[str, list[Sample]] = field(default_factory=dict)   # nccl --groups: per node
    unattributed: list[str] = field(default_factory=list)

    def add(self, src: str, dst: str, gbps: float) -> None:
        if src != dst and gbps > 0:
            self.values.setdefault((src, dst), []).append(gbps)

    @property
    def nodes(self) -> list[str]:
        return sorted({n for pair in self.values for n in pair})


def node_name(host: Any) -> str:
    """A pair record's name for a host: h2 for a lab host ("mb-L-h2 (10.213.0.3)"), else as given."""
    match = _LAB_HOST.search(str(host))
    return match.group(1) if match else str(host)


def collect(documents: list[tuple[str, dict[str, Any]]]) -> PairSet:
    out = PairSet()
    for location, record in documents:
        cfg = json_object(record.get("config"))
        out.sources.append(location)
        if record.get("kind") == "hunt":
            hosts = [node_name(h) for h in cfg.get("hosts") or []]
            out.addresses.update(zip(hosts, [str(a) for a in cfg.get("addresses") or []], strict=False))
            if cfg.get("lab"):
                out.labs.add(str(cfg["lab"]))
            for row in record.get("rows") or []:
                if isinstance(row, dict) and "src" in row and isinstance(row.get("bw_gbps"), (int, float)):
                    out.add(node_name(row["src"]), node_name(row["dst"]), float(row["bw_gbps"]))
        elif record.get("kind") == "nccl":
            _node_groups(location, record, out)
        else:   # a link between two hosts: its best one-way bandwidth, rank 0's host sending
            a, b = [node_name(h) for h in (cfg.get("probe") or {})["hosts"]]
            best = [float(r["bw_gbps"]) for r in record.get("rows") or []
                    if isinstance(r, dict) and r.get("op") == "uni" and isinstance(r.get("bw_gbps"), (int, float))]
            if best:
                out.add(a, b, max(best))
    return out


def _node_groups(location: str, record: dict[str, Any], out: PairSet) -> None:
    """Each node's figure from the node-group rows of an `nccl --groups` record: a node's group
    is done when its slowest rank is, so its time is the largest of its ranks' medians."""
    topo = (record.get("summary") or {}).get("topology") or {}
    hosts, per_node = [node_name(h) for h in topo.get("hosts") or []], topo.get("ranks_per_node")
    if not hosts or not isinstance(per_node, int) or per_node < 1:
        out.unattributed.append(f"{location}: no host names per node (written before microbench recorded them)")
        return
    impl = record.get("implementation") or {}
    device = f"{per_node} local ranks of the node, {impl.get('backend', '?')} on {impl.get('device', '?')} (node group)"
    for row in record.get("rows") or []:
        ranks, busbw, p50 = (
            row.get("per_rank_time_us_p50"),
            row.get("busbw_gbps"),
            (row.get("time_us") or {}).get("p50"),
        )
        if row.get("group") != "node" or not isinstance(ranks, list) or len(ranks) != len(hosts) * per_node:
            continue
        if not (isinstance(busbw, (int, float)) and busbw > 0 and isinstance(p50, (int, float)) and p50 > 0):
            continue
        for index, host in enumerate(hosts):
            slowest = max(ranks[index * per_node:(index + 1) * per_node])
            value = busbw * p50 / slowest if slowest > 0 else 0.0
            if value > 0:
                out.node_samples.setdefault(host, []).append(Sample(
                    "nccl", f"nccl node group {row.get('op')} busbw_gbps", row.get("size_bytes"), value, value, value,
                    True, "network", device))
    out.unattributed.append(f"{location}: its cross-node groups span every node at once (hunt's pairs name nodes)")


@dataclass
class PairVerdicts:
    lines: list[Line]
    links: list[FleetFinding]
    slow: dict[tuple[str, str], str]        # directed pair -> FAIL | INCONCLUSIVE
    reference: float
    tests: int


def judge(pairs: PairSet, k: float, min_fraction: float, nic_of: dict[str, str]) -> PairVerdicts:
    merged = {p: stats.merge_repeats([(v, v, v) for v in vs], True) for p, vs in pairs.values.items()}
    values = [v for v, _, _ in merged.values()]
    ref = stats.median(values)
    sigma = stats.robust_sigma(values, ref)
    gates = {p: stats.gate_one(v, values, k, min_fraction, True, ref, sigma) for p, (v, _, _) in merged.items()}
    slow = {p: stats.noise_verdict(g, merged[p][2], True) for p, g in gates.items() if g.flagged}
    partners: dict[str, set[str]] = {}
    for a, b in merged:
        partners.setdefault(a, set()).add(b)
        partners.setdefault(b, set()).add(a)
    slow_with = {n: {b if a == n else a for a, b in slow if n in (a, b)} for n in partners}
    bad: list[str] = []
    while True:
        counts = {n: len(slow_with[n] - set(bad)) for n in partners if n not in bad}
        candidates = [n for n, c in counts.items() if c >= 2]
        if not candidates:
            break
        bad.append(max(candidates, key=lambda n: (counts[n] / len(partners[n]), counts[n], n)))
    lines = [_node_line(n, pairs, merged, gates, slow, ref, slow_with[n], partners[n], nic_of) for n in bad]
    links = []
    seen: set[frozenset[str]] = set()
    for a, b in sorted(slow):
        if a in bad or b in bad or frozenset((a, b)) in seen:
            continue
        seen.add(frozenset((a, b)))
        there, back = merged.get((a, b), (None,))[0], merged.get((b, a), (None,))[0]
        way = ", ".join(f"{x}->{y} {v:.4g} GB/s" for x, y, v in ((a, b, there), (b, a, back)) if v is not None)
        links.append(FleetFinding("link", f"slow link {a} <-> {b}: {way} against a pair median of {ref:.4g} GB/s, "
                                          f"while both are fine with their other partners",
                                  [a, b], _bisect_command(a, b, pairs, bad)))
    return PairVerdicts(lines, links, slow, ref, len(merged))


def _node_line(node: str, pairs: PairSet, merged: dict, gates: dict, slow: dict, ref: float, slow_partners: set[str],
               partners: set[str], nic_of: dict[str, str]) -> Line:
    sends = [p for p in slow if p[0] == node]
    receives = [p for p in slow if p[1] == node]
    way = ("sending and receiving" if len(sends) >= 2 and len(receives) >= 2 else
           "sending" if len(sends) >= len(receives) else "receiving")
    mine = sends if way != "receiving" else receives
    value = stats.median([merged[p][0] for p in mine])
    verdict = "FAIL" if all(slow[p] == "FAIL" for p in mine) else "INCONCLUSIVE"
    zs = [gates[p].z for p in mine if gates[p].z is not None]
    z = stats.median(zs) if zs else None
    listed = ", ".join(sorted(slow_partners))
    reason = (f"slow with {len(slow_partners)} of {len(partners)} partners ({listed}) while {way}: median "
              f"{value:.4g} GB/s against the fleet's pair median {ref:.4g} GB/s")
    device = nic_of.get(node) or (f"NIC at {pairs.addresses[node]}" if node in pairs.addresses else "its NIC")
    return Line(node, f"pairs {pairs.metric} ({way})", None, verdict, value, ref, value / ref if ref else None, z,
                device, reason, "network", "pairs", True)


def _bisect_command(a: str, b: str, pairs: PairSet, bad: list[str]) -> str:
    if pairs.labs:
        return f"microbench hunt --lab {sorted(pairs.labs)[0]}"
    third = next((n for n in pairs.nodes if n not in (a, b) and n not in bad), None)
    hosts = ",".join([a, b] + ([third] if third else []))
    return f"srun --nodelist={hosts} --ntasks-per-node=1 microbench hunt"
