"""Peer groups and drift (pure): nodes are compared only with nodes of their kind.

A node's kind is its GPU model and CPU model (world/environment.fingerprint; older records
without a stored fingerprint give the same fields from their environment). Within a group,
everything else the fingerprint holds should be the same on every node: the GPU count, the
driver, CUDA, torch, NCCL, the kernel, the CPU count, the memory, the NICs' models, speeds and
firmware. A node that differs from its group's majority there, or whose own records disagree
with each other (a driver upgraded between two steps), is DRIFT, with the field named:
"gpu_driver 550.54 on n17; 550.90 on 63 of 64".
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ...world.environment import fingerprint as fingerprint_of_env

KIND_FIELDS = ("gpu_model", "cpu_model")
DRIFT_FIELDS = ("gpu_count", "gpu_driver", "cuda", "torch", "nccl", "kernel", "cpu_count", "memory_gib",
                "nic_models", "nic_speeds_mbps", "nic_firmware")
# Two nodes of one kind differ in usable memory by what firmware and the kernel reserve: within
# 2% is the same memory; a missing DIMM is 1/8 or more.
MEMORY_TOLERANCE = 0.02


def flat_fingerprint(environment: dict[str, Any]) -> dict[str, str]:
    """The fingerprint of a record's environment as comparable text per field."""
    env = environment if isinstance(environment, dict) else {}
    given = env.get("fingerprint")
    fp = given if isinstance(given, dict) else fingerprint_of_env(env)
    nics = [n for n in fp.get("nics") or [] if isinstance(n, dict)]
    memory = fp.get("memory_bytes")

    def text(value: Any) -> str:
        return "-" if value in (None, "", []) else str(value)

    return {
        "gpu_model": text(fp.get("gpu_model")), "cpu_model": text(fp.get("cpu_model")),
        "gpu_count": text(fp.get("gpu_count")), "gpu_driver": text(fp.get("gpu_driver")),
        "cuda": text(fp.get("cuda")), "torch": text(fp.get("torch")), "nccl": text(fp.get("nccl")),
        "kernel": text(fp.get("kernel")), "cpu_count": text(fp.get("cpu_count")),
        "memory_gib": f"{memory / 2**30:.1f}" if isinstance(memory, (int, float)) and memory else "-",
        "nic_models": text(", ".join(sorted(str(n.get("model")) for n in nics))),
        "nic_speeds_mbps": text(", ".join(sorted(str(n.get("speed_mbps")) for n in nics))),
        "nic_firmware": text(", ".join(sorted(str(n.get("firmware")) for n in nics))),
    }


@dataclass
class NodePrint:
    """One node's fingerprint over its records: per field, how many records said which value."""
    node: str
    fields: dict[str, Counter] = field(default_factory=dict)

    def add(self, flat: dict[str, str]) -> None:
        for key, value in flat.items():
            self.fields.setdefault(key, Counter())[value] += 1

    def value(self, key: str) -> str:
        counts = self.fields.get(key) or Counter({"-": 1})
        return max(counts, key=lambda v: (counts[v], v))

    @property
    def kind(self) -> tuple[str, ...]:
        return tuple(self.value(k) for k in KIND_FIELDS)


@dataclass
class Group:
    name: str                 # "GPU -, CPU Intel(R) Xeon(R) Processor"
    kind: tuple[str, ...]
    nodes: list[str]


def describe_kind(kind: tuple[str, ...]) -> str:
    gpu, cpu = kind
    return f"{'no GPU' if gpu == '-' else gpu}; {cpu}"


def peer_groups(prints: dict[str, NodePrint]) -> list[Group]:
    """Nodes grouped by kind, the largest group first."""
    by_kind: dict[tuple[str, ...], list[str]] = {}
    for node in sorted(prints):
        by_kind.setdefault(prints[node].kind, []).append(node)
    ordered = sorted(by_kind.items(), key=lambda item: (-len(item[1]), item[0]))
    return [Group(describe_kind(kind), kind, nodes) for kind, nodes in ordered]


def _same(key: str, a: str, b: str) -> bool:
    if key == "memory_gib" and a != "-" and b != "-":
        x, y = float(a), float(b)
        return abs(x - y) <= MEMORY_TOLERANCE * max(x, y)
    return a == b


def drift(group: Group, prints: dict[str, NodePrint]) -> tuple[dict[str, list[str]], list[str]]:
    """(node -> what drifted, one phrase per field; the group's own splits). Against the
    group's majority (more than half of its nodes), and within a node's own records. A field
    with no majority is the group's finding, not any one node's."""
    out: dict[str, list[str]] = {}
    split: list[str] = []
    nodes = group.nodes
    for key in DRIFT_FIELDS:
        values = {n: prints[n].value(key) for n in nodes}
        counts = Counter(values.values())
        majority = max(counts, key=lambda v: (counts[v], v))
        agree = sum(1 for v in values.values() if _same(key, v, majority))
        if len(nodes) >= 2 and agree <= len(nodes) / 2:
            split.append(f"{key} has no majority in group {group.name}: "
                         + "; ".join(f"{v} on {c}" for v, c in counts.most_common()))
        for node in nodes:
            own = prints[node].fields.get(key) or Counter()
            if len(own) > 1:
                seen = ", ".join(f"{v} in {c} record{'s' if c > 1 else ''}" for v, c in own.most_common())
                out.setdefault(node, []).append(f"{key} differs between {node}'s own records: {seen}")
            elif len(nodes) >= 2 and agree > len(nodes) / 2 and not _same(key, values[node], majority):
                out.setdefault(node, []).append(f"{key} {values[node]} on {node}; {majority} on {agree} of "
                                                f"{len(nodes)}")
    return out, split
