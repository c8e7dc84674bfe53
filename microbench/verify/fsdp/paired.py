"""The composer's measured inputs for a step, read together right before it: the compute replay,
the collective probe at the unit sizes and AdamW at the shard size, every rank at once. On a
shared machine the speed drifts by tens of percent within a minute; a step predicted from inputs
read at its own moment carries the same drift as the step. Collectives read once before the
steps drifted away from the same collectives timed after them, and the step rows' errors went
with theirs though collectives are a small part of a step (docs/verify.md has the figures)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ...compose.model import ModelShape
from ...core.stats import percentile
from ...world.dist import World
from .. import model as fm
from . import steps as vf


def median_collectives(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """The collectives input from readings taken at several moments: each row's median time over
    them (and its busbw's), the readings kept."""
    rows = []
    for i, row in enumerate(samples[0]["rows"]):
        each = [s["rows"][i] for s in samples]
        p50s = [r["time_us"]["p50"] for r in each]
        rows.append({**row, "busbw_gbps": percentile([r["busbw_gbps"] for r in each], 50),
                     "time_us": {"p50": percentile(p50s, 50), "samples_p50": p50s}})
    return {**samples[0], "rows": rows}


@dataclass(frozen=True)
class Inputs:
    """The composer's measured inputs for one step, read together right before it."""
    replay_s: float
    collectives: dict[str, Any]
    optimizer: dict[str, Any]

    def for_predict(self, shape: ModelShape, tokens: int) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        """(compute, collectives, optimizer) from this sample alone, as predict() takes them."""
        return vf.compute_input(shape, tokens, [self.replay_s]), self.collectives, self.optimizer


def inputs_sampler(world: World, shape: ModelShape, tokens: int, device: Any, dev: str, backend: str,
                   precision: fm.Precision, layout: Any = None) -> Callable[[], Inputs]:
    """One call: the compute replay, the collective probe (a steps.PAIRED reading) and one AdamW step."""
    probe = vf.replay(shape, tokens, dev, precision.param_dtype)
    comm = vf.collectives_sampler(world, shape, precision, dev, backend, layout)
    optimizer, n = vf.optimizer_sampler(world, shape, device, layout)
    return lambda: Inputs(probe.time_once(world), comm(vf.PAIRED), vf.optimizer_input(optimizer(), n))


def median_inputs(shape: ModelShape, tokens: int,
                  samples: list[Inputs]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(compute, collectives, optimizer) over every sample: the medians predict() takes for the row."""
    n = samples[0].optimizer["shard_params"]
    optimizer = vf.optimizer_input(percentile([s.optimizer["time_s"] for s in samples], 50), n)
    optimizer["samples_s"] = [s.optimizer["time_s"] for s in samples]
    return (vf.compute_input(shape, tokens, [s.replay_s for s in samples]),
            median_collectives([s.collectives for s in samples]), optimizer)
