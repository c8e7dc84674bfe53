"""compose's flag values as typed, and their parsers: (text, flag) -> value, each number through
core/units.py, each refusal one line quoting the flag and the text (core/options.py's contract).
Nothing here reads a file; build.py reads the records the values name."""


from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...core.errors import UsageError
from ...core.units import (
    parse_bandwidth_bytes_per_s,
    parse_duration_s,
    parse_number,
    parse_positive,
    parse_positive_int,
    parse_size,
)
from .. import dataload
from ..checkpoint import full as fs
from ..hardware import gpu as gpu_by_name
from ..model import preset
from ..sharding.predict import Strategy, parse_sharding
from ..tiers import described

DEFAULT_MFU = 0.4
# Past these a value is a typo, not a plan (and a loop over it would never end).
MAX_PARAMS = 1e15          # a thousand times today's largest models
MAX_LAYERS = 100_000
MAX_TFLOPS = 1e5           # 100 PFLOP/s per rank
MAX_SEQ_LEN = 1 << 24      # 16M tokens in one sequence
MAX_MICRO_BATCH = 1 << 16
MAX_GRAD_ACCUM = 1 << 16
MAX_NODES = 100_000
MAX_GPUS_PER_NODE = 1024
MAX_RANKS = 10_000_000
MAX_STEPS = 10_000_000
MAX_TOKENS = 1e16


@dataclass(frozen=True)
class NamedRecord:
    """`[NAME=]RECORD`: a record's path and the name it is shown under ("" : from the record)."""
    name: str
    path: str


@dataclass(frozen=True)
class Typed:
    """A number and the text it was typed as (the output quotes the flag as given)."""
    value: float
    text: str


@dataclass(frozen=True)
class DescribedNet:
    """`--net NAME=BUSBW[@LATENCY]`."""
    name: str
    busbw_gbps: float
    latency_s: float
    text: str


@dataclass(frozen=True)
class SerializeRate:
    """`--serialize-rate GB/S|RECORD`: a rate, or a `checkpoint --state-dict full` record's path."""
    gbps: float | None
    path: str | None
    text: str


def named_record(text: str, flag: str) -> NamedRecord:
    name, sep, path = str(text).partition("=")
    if not sep or "/" in name or name.endswith(".json"):
        return NamedRecord("", str(text))
    return NamedRecord(name, path)


def net(text: str, flag: str) -> DescribedNet:
    name, sep, spec = str(text).partition("=")
    if not sep or not name or not spec:
        raise UsageError(f"invalid --net {text!r}: expected NAME=BUSBW[@LATENCY], e.g. --net ib=40GB/s@30us")
    rate, _, latency = spec.partition("@")
    busbw = parse_bandwidth_bytes_per_s(rate, what=f"--net {name} bus bandwidth") / 1e9
    lat = parse_duration_s(latency, what=f"--net {name} latency", example="30us") if latency else 0.0
    return DescribedNet(name, busbw, lat, str(text))


def model_name(text: str, flag: str) -> str:
    preset(text)   # refuses an unknown name with the list of presets
    return str(text).strip().lower()


def gpu_name(text: str, flag: str) -> str:
    return gpu_by_name(text).name


def count(example: str, maximum: int) -> Any:
    """A positive whole number up to `maximum`."""
    def parse(text: str, flag: str) -> int:
        return parse_positive_int(text, what=flag, example=example, maximum=maximum)
    return parse


def params(text: str, flag: str) -> float:
    return parse_positive(text, what=flag, example="7e9", maximum=MAX_PARAMS)


def mfu(text: str, flag: str) -> float:
    return parse_number(text, what=flag, example="0.4", minimum=0, allow_minimum=False, maximum=1)


def tflops(text: str, flag: str) -> float:
    return parse_positive(text, what=flag, example="400", maximum=MAX_TFLOPS)


def fraction(text: str, flag: str) -> float:
    return parse_number(text, what=flag, example="1", minimum=0, maximum=1)


def duration(example: str, allow_zero: bool = True) -> Any:
    def parse(text: str, flag: str) -> float:
        return parse_duration_s(text, what=flag, example=example, allow_zero=allow_zero)
    return parse


def hours(text: str, flag: str) -> float:
    return parse_positive(text, what=flag, example="24")


def overhead_fraction(text: str, flag: str = "--ckpt-overhead") -> float:
    """5% or 0.05: a share of time, more than 0 and under all of it."""
    raw = str(text).strip()
    value = parse_number(raw.rstrip("%"), what=flag, example="5%", minimum=0, allow_minimum=False,
                         maximum=100 if raw.endswith("%") else 1, allow_maximum=False, typed=raw)
    return value / 100 if raw.endswith("%") else value


def size(text: str, flag: str) -> int:
    return parse_size(text, what=flag)


def sample_bytes(text: str, flag: str) -> Typed:
    return Typed(float(parse_size(text, what=flag)), str(text))


def tokens(text: str, flag: str) -> Typed:
    return Typed(parse_number(text, what=flag, example="1e9", minimum=1, maximum=MAX_TOKENS), str(text))


def state_dicts(text: str, flag: str) -> list[str]:
    return fs.parse_state_dicts(text)


def save_format(text: str, flag: str) -> str:
    if text not in fs.SAVE_FORMATS:
        raise UsageError(f"invalid --save-format {text!r}: expected one of {', '.join(fs.SAVE_FORMATS)}, "
                         f"e.g. --save-format torch")
    return str(text)


def serialize_rate(text: str, flag: str) -> SerializeRate:
    if Path(text).is_file():
        return SerializeRate(None, str(text), str(text))
    try:
        gbps = described.rate_gbps(text, text, "serialization")
    except UsageError:
        raise UsageError(f"invalid --serialize-rate {text!r}: expected GB/s (e.g. 2 or 2GB/s) or a "
                         f"`microbench checkpoint --state-dict full` record") from None
    return SerializeRate(gbps, None, str(text))


def data_rate(text: str, flag: str) -> dataload.DataRate:
    return dataload.rate_from_text(text, None)


def tier_names(text: str, flag: str) -> list[str]:
    names = list(dict.fromkeys(n.strip() for n in str(text).split(",") if n.strip()))
    if not names:
        raise UsageError(f"invalid {flag} {text!r}: expected tier names (a comma list), e.g. {flag} shared")
    return names


def sharding(text: str, flag: str) -> tuple[Strategy, ...]:
    return tuple(parse_sharding(text))


def node_counts(text: str, flag: str) -> tuple[int, ...]:
    counts: list[int] = []
    for part in [p.strip() for p in str(text).split(",") if p.strip()]:
        n = parse_positive_int(part, what="--scale-nodes", example="2,8,64")
        if n > MAX_NODES:
            raise UsageError(f"invalid --scale-nodes {part!r}: at most {MAX_NODES:,} nodes, e.g. --scale-nodes 2,8,64")
        if n not in counts:
            counts.append(n)
    return tuple(counts)


def checkpointing(text: Any, flag: str) -> str:
    """none | full | blocks:F | ops, as its label (kernels/recompute.py says what each recomputes)."""
    from ..kernels.recompute import parse_checkpointing

    return parse_checkpointing(text).label


def step_seconds(text: Any, flag: str) -> float:
    from ..kernels.calibration import check_measured_step

    return check_measured_step(text, flag)
