"""What the ranks of `verify fsdp` run: the calibration, the step configurations of one link
profile, the checkpoint. Rank 0 appends each finished row to the run's record file (the
launching process created it) so the rows survive a rank that dies later; on a failure rank 0
marks the record partial and says which rank is gone."""

from __future__ import annotations

import functools
import os
import traceback
import warnings
from typing import Any, Callable

from ...compose.model import ModelShape
from ...core.errors import Interrupted, MicrobenchError, RunError
from ...core.stats import percentile
from ...results.store import RecordWriter
from ...world import interrupts
from ...world.dist import World
from ...world.topology import machine_ranks
from .. import collector, model as fm
from ..spec import StepsSpec, where
from . import calibrate as vc, hybrid, paired, steps as vf


def quiet() -> None:
    # torch warns once per process about renamed collectives; nothing a user can act on.
    warnings.filterwarnings("ignore", category=FutureWarning)


def device_of(dev: str) -> Any:
    import torch

    if dev == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    # Ranks share the cores: one rank per core's worth of threads, as a launcher would set.
    local = machine_ranks()
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // local))
    return torch.device("cpu")


def _raise_interrupt() -> None:
    raise KeyboardInterrupt


def guarded(world: World, record: RecordWriter | None, what: str, fn: Callable[[], Any]) -> Any:
    """Run fn; turn a peer's death into one line naming it, with the record marked partial."""
    error: MicrobenchError
    try:
        return fn()
    except (KeyboardInterrupt, Interrupted):
        # Forwarded by the launcher (or a Ctrl-C to the group): the record says so and ends.
        reason, error = f"interrupted during {what}", Interrupted(f"interrupted during {what}")
    except MicrobenchError as exc:
        reason = str(exc)
        error = exc
    except Exception as exc:
        if os.environ.get("MICROBENCH_DEBUG"):
            traceback.print_exc()
        if interrupts.pending():   # a peer that got the same signal left first and broke our collective
            return guarded(world, record, what, _raise_interrupt)
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        world.note_failure(first)
        missing = world.missing_ranks()
        notes = {} if missing else world.peer_notes()
        if missing:
            reason = (f"rank {', '.join(map(str, missing))} died or stopped responding during {what} "
                      f"(no heartbeat, no error reported)")
        else:
            reason = f"{what} failed: {type(exc).__name__}: {first}"
            # What the others saw: where a peer failed first, its own error says more than the
            # collective it broke here ("Connection closed by peer").
            reason += "".join(f"; rank {r}: {note}" for r, note in sorted(notes.items()) if note != first)
        error = RunError(reason)
    if record is not None and world.rank == 0:
        record.finish("partial", reason)
        rows = len(record.record["rows"])
        raise type(error)(f"{reason}; kept {rows} finished row(s) in {record.path} (partial)") from None
    raise error from None


# --------------------------------------------------------------------------- steps

def step_row(world: World, shape: ModelShape, tokens: int, device: Any, dev: str, backend: str, precision: fm.Precision,
             cal: vf.Calibration, steps: int, warmup: int, profile: str, layout: Any = None) -> dict[str, Any]:
    # The compute replay (the step's kernels at its shapes), the collective probe at the unit sizes
    # and AdamW at the shard size run right before each step (paired.py): each step is predicted
    # from the inputs read at its own moment, and the row from their medians.
    sample = paired.inputs_sampler(world, shape, tokens, device, dev, backend, precision, layout)
    samples: list[paired.Inputs]
    times, samples = vf.measure_interleaved(world, shape, tokens, device, precision, steps, warmup, sample, layout)
    del sample
    compute, collectives, optimizer = paired.median_inputs(shape, tokens, samples)
    pred = vf.predict(shape, tokens, world.size, precision, compute, collectives, optimizer, cal)
    compute_alone = vf.measure_compute_alone(world, shape, tokens, device, precision)
    comm_alone = vf.measure_comm_alone(world, shape, precision, device, layout=layout)
    measured = percentile(times, 50)
    pred_each = [vf.predict(shape, tokens, world.size, precision, *s.for_predict(shape, tokens), cal)["step_s"]
                 for s in samples]
    pipelined = vf.predict(shape, tokens, world.size, precision, compute, collectives, optimizer,
                           vf.Calibration(1.0, cal.unit_overhead_s, cal.compute_efficiency, cal.source))["step_s"]
    parts = vf.parts(pred, pipelined, measured, compute_alone, comm_alone)
    parts["overlap"]["used"] = cal.overlap
    return {
        "kind": "step",
        "profile": profile,
        "sharding": layout.sharding if layout is not None else "full",
        **({"topology": collectives["topology"]} if "topology" in collectives else {}),
        "model": shape.name,
        "tokens": tokens,
        "ranks": world.size,
        "total_params": shape.total_params,
        "block_params": shape.block_params,
        "root_params": shape.root_params,
        "predicted_s": pred["step_s"],
        "measured_s": measured,
        "measured_steps_s": times,
        "predicted_steps_s": pred_each,
        "spread_pct": vf.spread_pct(times),
        "error_pct": vf.paired_error_pct(pred_each, times),
        "error_of_medians_pct": vf.error_pct(pred["step_s"], measured),
        "predicted": pred,
        "parts": parts,
        "inputs": {
            "compute": {
                "source": f"{compute['probe']}, measured in this run right before each measured step",
                "tflops_per_rank": compute["tflops"],
                "replay_s": compute["replay_s"],
                "samples_s": compute["samples_s"],
                "spread_pct": compute["spread_pct"],
            },
            "collectives": {
                "source": f"{collectives['probe']}, measured in this run right before each measured step",
                "rows": collectives["rows"],
            },
            "optimizer": {
                "source": f"{optimizer['probe']}, measured in this run right before each measured step",
                "memory_gbps": optimizer["memory_gbps"],
                "samples_s": optimizer["samples_s"],
            },
            "calibration": {
                "source": cal.source,
                "overlap": cal.overlap,
                "unit_overhead_s": cal.unit_overhead_s,
                "compute_efficiency": cal.compute_efficiency,
            },
        },
    }


def cal_key(profile: str, sharding: str | None) -> str:
    """Where a calibration is kept: per link profile, and per sharding beside full ("1gbit hybrid")."""
    return where(profile, sharding)


def run_steps(world: World, spec: StepsSpec) -> int:
    """One link profile: calibrate (unless given), then every (model, tokens) configuration,
    with Python's collector as a trainer runs it (collector.py)."""
    quiet()
    with collector.as_trainer():
        return _run_steps(world, spec)


def _run_steps(world: World, spec: StepsSpec) -> int:
    dev, backend, profile = spec.device, spec.backend, spec.profile
    layout = hybrid.layout_for(spec.sharding, world.size)
    key = cal_key(profile, layout.sharding)
    device = device_of(dev)
    precision = fm.precision_for(dev)
    record = RecordWriter.resume(spec.record) if world.rank == 0 else None
    given = spec.calibration
    if given is not None:
        cal_dict, source = given, spec.calibration_source or "--calibration"
    else:
        cal_dict = guarded(world, record, f"the calibration ({key})",
                           lambda: vc.calibrate(world, device, precision, dev, backend, layout, spec.cal_reps))
        source = f"calibrated in this run on {vc.CAL_SHAPE.name} ({vc.CAL_TOKENS} tokens) and tiny units, {key}"
        if record is not None:
            record.update(lambda r: r["summary"].setdefault("calibration_by_profile", {}).__setitem__(key, cal_dict))
    if spec.calibrate_only:
        return 0
    cal = vc.as_calibration(cal_dict, source)
    for model_name, tokens in spec.configs:
        collector.young()   # between configurations, outside every clock
        shape = fm.shape_from_args(**spec.shapes[model_name])
        label = f"{key} {shape.name} {tokens} tokens"
        row = guarded(world, record, label, functools.partial(step_row, world, shape, tokens, device, dev, backend,
                                                              precision, cal, spec.steps, spec.warmup, profile, layout))
        if record is not None:
            record.add_rows([row])
            print(f"# [{key}] {shape.name}, {tokens} tokens: predicted {row['predicted_s'] * 1e3:.1f} ms, "
                  f"measured {row['measured_s'] * 1e3:.1f} ms (spread {row['spread_pct']:.0f}%), "
                  f"error {row['error_pct']:+.1f}%", flush=True)
    return 0
