"""What a failed node costs a training job: the composer's step (or checkpoint save) for a named
model on the fleet's nodes, once with the fleet's median figures and once with that node's. A
synchronous job runs at the pace of its slowest node, so the node's figure paces the whole job:
"h2's NIC at 53% of the fleet makes every step of this job 1.9x slower".

What is priced: a network failure (the node's NIC or link: the collectives' bus bandwidth), a
compute failure (its matmul rate), a storage failure (its disk: each node writes its shard of
a checkpoint, so the save waits for the slowest disk). Memory bandwidth and anything else has
no composer input, and says so.

The composer is reached through one function, `compose_prices`, so that how it is called can
change in one place.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...core.errors import MicrobenchError
from . import stats
from .verdicts import Line

PRICED = ("network", "compute", "storage")


@dataclass(frozen=True)
class Job:
    """The job every failure is priced in: a model over the group's nodes."""
    model: str
    nodes: int
    gpus_per_node: int            # 0: CPU nodes, one rank each
    gpu: str | None               # a GPU the composer knows (h100, ...), from the fingerprint
    tflops: float | None          # the fleet's median measured rate per rank, when compute records exist
    network_gbps: float | None    # the fleet's median pair bandwidth, when pair records exist

    def describe(self) -> str:
        ranks = (
            f"{self.nodes} nodes x {self.gpus_per_node} GPUs" if self.gpus_per_node else f"{self.nodes} nodes x 1 rank"
        )
        return f"{self.model}, {ranks}"


@dataclass
class Cost:
    node: str
    kind: str
    text: str
    fleet_s: float | None = None
    node_s: float | None = None

    @property
    def slowdown(self) -> float | None:
        return self.node_s / self.fleet_s if self.fleet_s and self.node_s else None


def compose_prices(job: Job, tflops: float, nets: dict[str, float],
                   tiers: dict[str, float]) -> tuple[dict[str, float], dict[str, float]]:
    """The seam to the composer: (step seconds per network, save seconds per storage tier) for
    `job` at `tflops` per rank."""
    import argparse

    from ...compose import inputs as compose_inputs, whatif
    from ...core import sections

    # The composer's own flags, parsed as `microbench compose` parses them: one declaration.
    world = (["--nodes", str(job.nodes), "--gpus-per-node", str(job.gpus_per_node)] if job.gpus_per_node
             else ["--ranks", str(job.nodes)])
    argv = ["--model", job.model, "--tflops", f"{tflops:.6g}", *world, *(["--gpu", job.gpu] if job.gpu else [])]
    for name, gbps in nets.items():
        argv += ["--net", f"{name}={gbps:.6g}GB/s"]
    for name, gbps in tiers.items():
        argv += ["--tier", f"{name}={gbps:.6g}"]
    parser = argparse.ArgumentParser(add_help=False)
    sections.add_sections(parser, compose_inputs.ComposeOptions)
    opts = sections.parse_sections(compose_inputs.ComposeOptions, parser.parse_args(argv))
    result = whatif.compose(compose_inputs.build(opts))
    return ({name: step.step_s for name, step in result.steps.items()},
            {tier.tier: tier.save_s for tier in result.tiers if hasattr(tier, "save_s")})


def gpu_name(gpu_model: str) -> str | None:
    """The composer's name for a GPU model string from NVML ("NVIDIA H100 80GB HBM3" -> h100)."""
    from ...compose.hardware import GPUS

    text = str(gpu_model).lower().replace("-", "").replace(" ", "")
    return next((name for name in GPUS if name in text), None)


def _representative(lines: list[Line]) -> Line:
    """The failing line with the median ratio to the fleet: the node's typical shortfall."""
    ranked = sorted(lines, key=lambda line: _shortfall(line))
    return ranked[len(ranked) // 2]


def _shortfall(line: Line) -> float:
    """The node's figure as a share of the fleet's, oriented so that below 1 is worse."""
    ratio = line.ratio or 1.0
    return ratio if line.higher_better else 1.0 / ratio


def price(job: Job, node: str, lines: list[Line]) -> list[Cost]:
    """One Cost per kind of failure of `node`: the step or save with the fleet's figure and
    with the node's."""
    out = []
    by_kind: dict[str, list[Line]] = {}
    for line in lines:
        if line.verdict == "FAIL" and line.ratio and line.median:
            by_kind.setdefault(line.kind, []).append(line)
    for kind, failing in sorted(by_kind.items()):
        line = _representative(failing)
        share = _shortfall(line)
        if kind not in PRICED:
            out.append(Cost(node, kind, f"{node}'s {line.device} at {100 * share:.0f}% of the fleet: not priced, the "
                                        f"composer has no input for {kind} bandwidth"))
            continue
        try:
            out.append(_priced(job, node, kind, line, share))
        except MicrobenchError as exc:
            out.append(Cost(node, kind, f"{node}'s {line.device}: not priced ({exc})"))
    return out


def _priced(job: Job, node: str, kind: str, line: Line, share: float) -> Cost:
    at = f"{node}'s {line.device} at {100 * share:.0f}% of the fleet"
    if job.tflops is None:
        return Cost(node, kind, f"{at}: not priced (no compute record and no GPU the composer knows)")
    # Without a measured network the step is priced compute-only: a network far above any link.
    net = job.network_gbps or 1e4
    if kind == "storage":
        per_node = line.median if line.higher_better else line.value
        assert per_node is not None   # a storage line that is priced carries its figures
        _, saves = compose_prices(job, job.tflops, {"fleet": net},
                                  {"fleet": per_node * job.nodes, "node": per_node * share * job.nodes})
        before, after = saves["fleet"], saves["node"]
        what = "checkpoint save"
    elif kind == "network":
        base = job.network_gbps or (line.median if line.higher_better else None) or net
        steps, _ = compose_prices(job, job.tflops, {"fleet": base, "node": base * share}, {})
        before, after = steps["fleet"], steps["node"]
        what = "step"
    else:
        fleet_steps, _ = compose_prices(job, job.tflops, {"fleet": net}, {})
        node_steps, _ = compose_prices(job, job.tflops * share, {"fleet": net}, {})
        before, after = fleet_steps["fleet"], node_steps["fleet"]
        what = "step"
    factor = after / before if before else float("nan")
    return Cost(node, kind, f"{at} makes every {what} of this job {factor:.2f}x slower ({job.describe()}: "
                            f"{_seconds(before)} -> {_seconds(after)})", before, after)


def _seconds(value: float) -> str:
    return f"{value / 60:.1f} min" if value >= 120 else f"{value:.3g} s"


def job_for(model: str, group_nodes: list[str], prints: dict[str, Any], tflops: dict[str, float],
            network_gbps: float | None) -> Job:
    """The job of a group: its node count, GPUs per node and GPU from the fingerprint, its
    median measured compute rate (else the GPU's datasheet peak x the composer's default MFU)."""
    from ...compose.hardware import GPUS
    from ...compose.inputs import DEFAULT_MFU

    first = prints[group_nodes[0]]
    count = first.value("gpu_count")
    gpu = gpu_name(first.value("gpu_model"))
    rates = [tflops[n] for n in group_nodes if n in tflops]
    rate = stats.median(rates) if rates else (GPUS[gpu].peak_bf16_tflops * DEFAULT_MFU if gpu else None)
    return Job(model, len(group_nodes), int(count) if count.isdigit() else 0, gpu, rate, network_gbps)
