"""The two storage phases besides checkpoints: streaming batches each step and loading the model
at start and at every restart. Pure functions over `microbench dataload` / `modelload` records
or described rates; no probe, world or torch.

Data loading, per rank (each rank runs its own DataLoader, as a trainer does):
  loader_s      = samples the rank consumes per step (micro-batch x grad-accum) / the loader's
                  rate per rank (a record's all-ranks samples/s over its ranks; at another
                  sample size, no faster than its bytes rate allows).
  hidden        when the loader prefetches (workers > 0, or a described rate) and loader_s <= the
                  step: the next step's batches are ready while this one computes.
  stall_s       = what is not hidden: loader_s - step_s when prefetching, all of loader_s when
                  the main process reads (workers = 0).
Above 10% of the step the loader is the bottleneck (the usual rule for GPUs idling on data).

Model loading: weight bytes (params x dtype bytes) / the load rate (a modelload record's best
load_gbps, or a tier's read GB/s), paid at job start and again at each restart.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any, Callable

from ..core.errors import UsageError
from ..core.units import parse_number
from .curves import record_rows

BOTTLENECK_FRACTION = 0.10


@dataclass(frozen=True)
class DataRate:
    name: str
    samples_per_s_per_rank: float
    prefetch: bool
    source: str
    sample_bytes: float | None = None


@dataclass(frozen=True)
class DataStall:
    tier: str
    network: str
    samples_per_step: int
    loader_s: float
    step_s: float
    hidden: bool
    stall_s: float
    step_with_stall_s: float
    loader_fraction: float
    bottleneck: bool
    source: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _split(text: str) -> tuple[str, str]:
    name, sep, rest = text.partition("=")
    if not sep or "/" in name or name.endswith(".json"):
        return "", text
    return name, rest


def rate_from_record(record: dict[str, Any], source: str, sample_bytes: float | None, name: str = "") -> DataRate:
    """The best case of a dataload record (the workers count that read fastest)."""
    rows = [r for r in record_rows(record, source) if isinstance(r.get("samples_per_s"), (int, float))]
    if record.get("kind") != "dataload" or not rows:
        raise UsageError(f"--dataload {source!r} is not a dataload record with rows (kind "
                         f"{record.get('kind')!r}); expected one written by `microbench dataload`")
    best = max(rows, key=lambda r: r["samples_per_s"])
    ranks = max(int(best.get("ranks") or 1), 1)
    per_rank = best["samples_per_s"] / ranks
    if sample_bytes and best.get("read_gbps"):
        per_rank = min(per_rank, best["read_gbps"] * 1e9 / ranks / sample_bytes)
    label = name or f"{best.get('layout', 'dataload')}@{record.get('implementation', {}).get('filesystem', '?')}"
    return DataRate(label, per_rank, int(best.get("workers") or 0) > 0,
                    f"measured: {source} (workers={best.get('workers')})", sample_bytes)


def rate_from_text(text: str, sample_bytes: float | None) -> DataRate:
    name, value = _split(text)
    if not name:
        raise UsageError(f"invalid --data-rate {text!r}: expected NAME=SAMPLES/S, e.g. --data-rate nvme=4000")
    try:
        rate = parse_number(value.strip().removesuffix("/s"), what="--data-rate", example="nvme=4000", minimum=0,
                            allow_minimum=False)
    except UsageError as exc:   # the message quotes the flag's value as typed, name and all
        why = str(exc).split(": ", 1)[1].split(", e.g.")[0]
        raise UsageError(f"invalid --data-rate {text!r}: {why}, e.g. --data-rate nvme=4000") from None
    return DataRate(name, rate, True, f"--data-rate {text} (per rank, prefetching)", sample_bytes)


def data_rates(records: list[tuple[str, str]], described: list[DataRate], sample_bytes: float | None,
               load: Callable[[str], dict[str, Any]]) -> list[DataRate]:
    """The loader rates of --dataload records ((name, path) each) and --data-rate, at this sample size."""
    out = [rate_from_record(load(path), path, sample_bytes, name) for name, path in records]
    return out + [replace(rate, sample_bytes=sample_bytes) for rate in described]


def data_stall(rate: DataRate, samples_per_step: int, step_s: float, network: str = "") -> DataStall:
    if samples_per_step < 1 or step_s <= 0:
        raise UsageError("samples per step and the step time must be positive, e.g. --micro-batch 4")
    loader_s = samples_per_step / rate.samples_per_s_per_rank
    hidden = rate.prefetch and loader_s <= step_s
    stall = max(0.0, loader_s - step_s) if rate.prefetch else loader_s
    return DataStall(rate.name, network, samples_per_step, loader_s, step_s, hidden, stall, step_s + stall,
                     loader_s / step_s, loader_s > BOTTLENECK_FRACTION * step_s and stall > 0, rate.source)


@dataclass(frozen=True)
class ModelLoad:
    tier: str
    load_gbps: float
    weight_bytes: float
    load_s: float
    source: str
    restarts_per_day: float | None = None
    per_day_s: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def load_rate_from_record(record: dict[str, Any], source: str, name: str = "") -> tuple[str, float, str]:
    rows = [r for r in record_rows(record, source) if isinstance(r.get("load_gbps"), (int, float))]
    if record.get("kind") != "modelload" or not rows:
        raise UsageError(f"--modelload {source!r} is not a modelload record with load rows (kind "
                         f"{record.get('kind')!r}); expected one written by `microbench modelload`")
    best = max(rows, key=lambda r: r["load_gbps"])
    label = name or f"{best['op']}@{record.get('implementation', {}).get('filesystem', '?')}"
    return label, float(best["load_gbps"]), f"measured: {source} ({best['op']}, {best.get('ranks', 1)} rank(s))"


def model_load(tier: str, load_gbps: float, weight_bytes: float, source: str,
               mtbf_s: float | None = None) -> ModelLoad:
    if load_gbps <= 0:
        raise UsageError(f"model load rate for {tier!r} must be positive, got {load_gbps}")
    load_s = weight_bytes / (load_gbps * 1e9)
    per_day = 86400 / mtbf_s if mtbf_s else None
    return ModelLoad(tier, load_gbps, weight_bytes, load_s, source, per_day, load_s * per_day if per_day else None)


def model_loads(records: list[tuple[str, str]], tiers: list[Any], weight_bytes: float, mtbf_s: float | None,
                load: Callable[[str], dict[str, Any]]) -> list[ModelLoad]:
    """From each --modelload record ((name, path)), and from each tier's read rate (a raw read:
    safetensors' own cost is not in it)."""
    out = []
    for name, path in records:
        tier, gbps, source = load_rate_from_record(load(path), path, name)
        out.append(model_load(tier, gbps, weight_bytes, source, mtbf_s))
    for t in tiers:
        if t.read_gbps:
            out.append(model_load(t.name, t.read_gbps, weight_bytes, f"{t.source} (read rate)", mtbf_s))
    return out


def report_lines(stalls: list[DataStall], loads: list[ModelLoad], format_time: Callable[[float], str]) -> list[str]:
    """The two what-if tables as text lines (the command prints them)."""
    from tabulate import tabulate

    lines: list[str] = []
    if stalls:
        lines.append(f"\n## data loading: {stalls[0].samples_per_step} samples per rank per step "
                     f"(micro-batch x grad-accum)")
        table: list[tuple[str, ...]] = [(s.tier, s.network, format_time(s.loader_s), format_time(s.step_s),
                  "yes" if s.hidden else "no", format_time(s.stall_s), format_time(s.step_with_stall_s),
                  f"{s.loader_fraction:.0%}" + (" (bottleneck)" if s.bottleneck else "")) for s in stalls]
        lines.append(tabulate(table, headers=["data tier", "network", "loader/step", "step", "hidden by prefetch",
                                              "stall", "step + stall", "loader / step"], tablefmt="simple",
                              disable_numparse=True))
        lines.append("# loader/step: one rank's loader reading its samples for a step at the measured rate per rank; "
                     "hidden when workers prefetch and it fits in the step")
    if loads:
        lines.append(f"\n## model loading: {loads[0].weight_bytes / 1e9:.2f} GB of weights")
        table = [(m.tier, f"{m.load_gbps:.3g} GB/s", format_time(m.load_s), format_time(m.load_s),
                  format_time(m.per_day_s) if m.per_day_s is not None else "-", m.source) for m in loads]
        lines.append(tabulate(table, headers=["tier", "load rate", "at job start", "at each restart",
                                              "per day (MTBF)", "from"], tablefmt="simple", disable_numparse=True))
    return lines


@dataclass(frozen=True)
class Loading:
    """The data stall per data tier and network, and the model load per tier."""
    stalls: list[DataStall]
    loads: list[ModelLoad]

    def as_dict(self) -> dict[str, Any]:
        return {"data_stall": [s.as_dict() for s in self.stalls], "model_load": [m.as_dict() for m in self.loads]}


def loading(rates: list[DataRate], modelload: list[tuple[str, str]], tiers: list[Any], weight_bytes: float,
            samples_per_step: int, step_s: dict[str, float], mtbf_s: float | None,
            load: Callable[[str], dict[str, Any]]) -> Loading:
    """`compose --dataload/--data-rate/--modelload`: each loader against each network's step, and
    the model's load per tier (asked for with any of the three)."""
    stalls = [data_stall(r, samples_per_step, step, net) for r in rates for net, step in step_s.items()]
    loads = model_loads(modelload, tiers, weight_bytes, mtbf_s, load) if (modelload or rates) else []
    return Loading(stalls, loads)
