"""`--expected` and the per-run expectations the nccl, link and storage commands print beside
their results (expected.py has the formulas, hwfacts.py reads the machine)."""

from __future__ import annotations

import argparse
import os
import socket
from typing import Any

from ..core.errors import UsageError
from ..core.probe import RankGroup
from ..core.units import parse_bandwidth_bytes_per_s
from . import facts as hwfacts, formulas as ex


def add_option(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--expected", default=None, metavar="RATE",
                   help=f"the {what} this hardware should reach, overriding what sysfs/NVML say, with a unit: "
                        f"e.g. 24GB/s or 200Gbit (results then show %% of it)")


def override(text: str | None) -> dict[str, Any] | None:
    """The --expected value as an expectation, or None. Bare numbers and negatives exit 2."""
    if text is None:
        return None
    if str(text).strip().startswith("-"):
        raise UsageError(f"invalid --expected {text!r}: must be a positive rate, e.g. --expected 24GB/s")
    gbps = parse_bandwidth_bytes_per_s(text, what="--expected") / 1e9
    return ex.known(gbps, "given with --expected", "override", expected=str(text))


def layout(world: RankGroup) -> tuple[int, int]:
    """(nodes, ranks per node) from every rank's host name (a lab host counts as a node)."""
    me = os.environ.get("MICROBENCH_LAB_HOST") or socket.gethostname()
    hosts = world.all_gather_object(me)
    nodes = len(set(hosts))
    return nodes, max(1, world.size // nodes)


def for_collectives(world: RankGroup, ops: list[str], device: str, given: dict[str, Any] | None,
                    transport: str = "auto") -> dict[str, Any]:
    """{"expected": {op: expectation}, "expected_facts": facts}, the same on every rank."""
    nodes, per_node = layout(world)
    out = None
    if world.rank == 0:
        facts = hwfacts.collect(device=device)
        per_op = {op: given or ex.expected_busbw(facts, op, nodes=nodes, ranks_per_node=per_node, device=device,
                                                 transport=transport)
                  for op in ops}
        out = {"expected": per_op, "expected_facts": facts}
    return world.broadcast_object(out)


def for_link(hosts: list[str], given: dict[str, Any] | None) -> dict[str, Any]:
    facts = hwfacts.collect()
    return {"expected": given or ex.expected_link(facts, same_host=len(set(hosts)) < 2), "expected_facts": facts}


def for_storage(workdir_facts: dict[str, Any], given: dict[str, Any] | None) -> dict[str, Any]:
    facts = hwfacts.collect()
    return {"expected": given or ex.expected_storage(facts, filesystem=workdir_facts["filesystem"],
                                                     device=workdir_facts["device"]), "expected_facts": facts}


def for_s3(endpoint_url: str | None, embedded: bool, given: dict[str, Any] | None) -> dict[str, Any]:
    from urllib.parse import urlparse

    facts = hwfacts.collect()
    host = urlparse(endpoint_url).hostname if endpoint_url else None
    return {"expected": given or ex.expected_s3(facts, endpoint_host=host, embedded=embedded), "expected_facts": facts}


describe = ex.describe


def pct_cell(value: float | None, expectation: dict[str, Any] | None) -> str:
    pct = ex.percent(value, expectation)
    return "-" if pct is None else f"{pct:.0f}%"
