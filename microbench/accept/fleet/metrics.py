"""One node's figures from one record: a Sample per row and metric, with the range its
per-iteration times allow and the device it was measured on (pure).

A sample's metric is its step, its case (the op and the case keys that vary in the record:
`read bs=16M`) and the metric column: "storage posix read bs=16M read_gbps". Each row gives
its probe's primary metric, or where it has none its p50 latency (link's rtt rows). The size is
kept apart: the fleet compares every node at one size per metric (fleet/analysis.py).

The range is compare's noise model: a rate computed from time_us.p50 spans the rate of the
slowest iteration to that of the fastest (value x p50/max .. value x p50/min); a latency that
is its own statistic (rtt_us_p50, over every round trip of a timed batch) is given the spread
of its batches' times (value x max/p50 .. value x min/p50).
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from typing import Any, TypeGuard

from ...core import registry
from ...core.jsonfile import json_object
from ...core.units import format_size
from .. import compare

KINDS = ("network", "compute", "memory", "storage", "other")
# Row fields that name which of several like devices of a node a row measured (a GPU, a NIC or
# rail, a mount): rows differing only there are sisters, compared with each other.
POSITION_KEYS = ("gpu", "device_index", "nic", "rail", "mount_point")
_LATENCY_P50 = re.compile(r"_(us|ms)_p50$|^lat_p50_us$")
GPU_OPS = ("h2d", "d2h", "d2d")


@dataclass(frozen=True, slots=True)
class Sample:
    step: str
    metric: str            # "nccl all_reduce busbw_gbps"
    size_bytes: int | None
    value: float
    worst: float           # the value at the slowest iteration (== value without per-iteration times)
    best: float            # ... at the fastest
    higher_better: bool
    kind: str              # network | compute | memory | storage | other
    device: str            # "disk /dev/vda (/, ext4)"; "@PATH" until resolved against the node's disks
    position: str = ""     # which sister device ("gpu=3"), "" for the node's one

    @property
    def key(self) -> tuple[str, int | None, str]:
        return self.metric, self.size_bytes, self.position


def kind_of(spec_name: str) -> str:
    spec = registry.find(spec_name)
    if spec is None:
        return "other"
    if spec.name == "memory":
        return "memory"
    if spec.name == "link" or "network" in spec.feeds:
        return "network"
    if "compute" in spec.feeds:
        return "compute"
    if set(spec.feeds) & {"tier", "dataload", "modelload"}:
        return "storage"
    return "other"


def _number(value: Any) -> TypeGuard[int | float]:
    """A finite number: rows are read as they are, and NaN or infinity in one is no figure."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _label(row: dict[str, Any], fields: tuple[str, ...], varying: set[str]) -> str:
    extras = []
    for key in fields:
        if key in ("op", "size_bytes") or key not in varying or key not in row or key in POSITION_KEYS:
            continue
        value = row[key]
        if key.endswith("_bytes") and isinstance(value, int):
            extras.append(f"{key.removesuffix('_bytes')}={format_size(value)}")
        else:
            extras.append(f"{key}={value}")
    return " ".join([str(row.get("op", "?")), *extras])


def _metric_of(row: dict[str, Any], record: dict[str, Any]) -> str | None:
    key = registry.row_metric(row, record)
    if key is not None and _number(row.get(key)) and row[key] > 0:
        return key
    return next((k for k in row if _LATENCY_P50.search(k) and _number(row[k]) and row[k] > 0), None)


def _range(row: dict[str, Any], metric: str, value: float) -> tuple[float, float]:
    """(worst, best) of the metric over the row's iterations (compare.spread_us)."""
    spread = compare.spread_us(row)
    p50 = (row.get("time_us") or {}).get("p50") if isinstance(row.get("time_us"), dict) else None
    if spread is None:
        return value, value
    low, high = spread
    if metric == "time_us":
        return high, low
    if not (_number(p50) and p50 > 0):
        return value, value
    if _higher_is_better(metric):
        return value * p50 / high, value * p50 / low
    # A latency that is its own statistic (link's rtt over every round trip of a batch) moves
    # with the batches' times: their spread is its noise.
    return value * high / p50, value * low / p50


@functools.lru_cache(maxsize=None)
def _higher_is_better(metric: str) -> bool:
    return compare.higher_is_better(metric)


def samples(step: str, record: dict[str, Any]) -> list[Sample]:
    """Every row's metric of one record (pure)."""
    spec = registry.for_record(record)
    kind = kind_of(spec.name if spec else "")
    rows = [r for r in record.get("rows") or [] if isinstance(r, dict)]
    defaults = registry.case_defaults(record)
    rows = [{**defaults, **r} for r in rows]
    fields = compare.case_fields(record)
    varying: dict[Any, set[str]] = compare.varying(rows, fields)
    out = []
    for row in rows:
        metric = _metric_of(row, record)
        if metric is None:
            continue
        value = float(row[metric])
        worst, best = _range(row, metric, value)
        size = row.get("size_bytes") if isinstance(row.get("size_bytes"), int) else None
        position = " ".join(f"{k}={row[k]}" for k in POSITION_KEYS if k in row and row[k] is not None)
        out.append(Sample(step, f"{step} {_label(row, fields, varying.get(row.get('op'), set()))} {metric}", size,
                          value, worst, best, _higher_is_better(metric), kind,
                          device_of(spec.name if spec else "", record, row), position))
    return out


def device_of(probe: str, record: dict[str, Any], row: dict[str, Any]) -> str:
    """What a row measured, named as an operator finds it on the node."""
    env = json_object(record.get("environment"))
    impl = json_object(record.get("implementation"))
    cfg = (record.get("config") or {}).get("probe") or {} if isinstance(record.get("config"), dict) else {}
    cpu = env.get("cpu_model") or "CPU"
    gpus = [g for g in env.get("gpus") or [] if isinstance(g, dict)]

    def gpu(index: Any) -> str:
        name = next((g.get("name") for g in gpus if g.get("index") == index), None) or impl.get("gpu") or "GPU"
        return f"GPU {index} ({name})"

    if probe == "memory":
        return gpu(row.get("gpu", 0)) if row.get("op") in GPU_OPS else f"host memory ({cpu})"
    if probe == "compute":
        return gpu(row.get("gpu", 0)) if impl.get("device") == "cuda" else f"CPU ({cpu})"
    if probe == "nccl":
        ranks = row.get("ranks") or ((record.get("config") or {}).get("world") or {}).get("size")
        return f"{ranks} local ranks, {impl.get('backend', '?')} on {impl.get('device', '?')}"
    if probe == "link":
        return f"TCP between local ranks ({impl.get('transport', 'tcp')})"
    if impl.get("device") and impl.get("mount_point"):
        return f"disk {impl['device']} ({impl['mount_point']}, {impl.get('filesystem', '?')})"
    mounts = json_object(impl.get("mounts"))
    mount = mounts.get(str(row.get("mode"))) if mounts else None
    if isinstance(mount, dict):
        return f"mount {mount.get('mount_fstype', '?')} ({mount.get('mount_mode', row.get('mode'))})"
    if impl.get("target") == "embedded" or str(impl.get("target_kind")) == "s3" or probe == "storage_s3":
        return "S3 " + ("(embedded rclone server)" if impl.get("target") == "embedded" or not impl.get("endpoint")
                        else str(impl.get("endpoint")))
    place = (
        impl.get("dataset_dir") or impl.get("model_dir") or impl.get("workdir") or cfg.get("target") or cfg.get("path")
    )
    return f"@{place}" if place else f"{probe} target"


def disk_of(record: dict[str, Any]) -> tuple[str, str] | None:
    """(directory, disk label) of a record that names its disk (posix storage): where other
    records of the node that name only a directory find theirs."""
    impl = json_object(record.get("implementation"))
    if impl.get("device") and impl.get("mount_point") and impl.get("workdir"):
        return str(impl["workdir"]), f"disk {impl['device']} ({impl['mount_point']}, {impl.get('filesystem', '?')})"
    return None


def resolve_devices(samples_of_node: list[Sample], disks: dict[str, str]) -> list[Sample]:
    """A checkpoint, dataload or modelload record names the directory it used, not its disk: a
    posix storage record of the node run in or under that directory (the suite runs every
    storage step in one scratch directory) names the disk (pure)."""
    out = []
    for sample in samples_of_node:
        if sample.device.startswith("@"):
            place = sample.device[1:].rstrip("/")
            disk = next((label for workdir, label in disks.items()
                         if workdir == place or workdir.startswith(place + "/")
                         or place.startswith(workdir.rsplit("/", 1)[0] + "/")), None)
            sample = Sample(sample.step, sample.metric, sample.size_bytes, sample.value, sample.worst, sample.best,
                            sample.higher_better, sample.kind, disk or f"directory {place}", sample.position)
        out.append(sample)
    return out
