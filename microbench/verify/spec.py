"""What a verify launcher hands each rank of a phase: a typed spec, written to a file only this
user can read and read back by every rank (the ranks are fresh interpreters, or forks on a lab
host's namespace, so the spec crosses as JSON). This module is its one serialization: `dumps`
tags the spec with its phase, `loads` rebuilds the very dataclass, nested ones included.

Every rank of a phase gets the same spec; what differs per rank (its rank, its lab host) comes
from the launcher's environment, as under torchrun."""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..compose.job.assignment import Assignment


@dataclass(frozen=True)
class RankSpec:
    """What every verify phase's ranks share: where they run, the record rank 0 appends to, and
    the calibration (given, or None: the phase calibrates first)."""

    phase: ClassVar[str] = ""
    device: str
    backend: str
    record: str                              # the run's record file, claimed by the launcher
    timeout_s: float
    nproc: int
    calibration: dict[str, Any] | None = None   # a record's summary.calibration, as given
    calibration_source: str | None = None
    cal_reps: int | None = None              # timed steps per calibration number (None: their defaults)

    @property
    def where(self) -> str:
        """The phase as its rows name it: what the launcher's record of its load is keyed by."""
        return self.phase


@dataclass(frozen=True)
class StepsSpec(RankSpec):
    """verify fsdp, one link profile and sharding: calibrate (unless given), then every (model,
    tokens) configuration."""

    phase: ClassVar[str] = "steps"
    shapes: dict[str, dict[str, Any]] = field(default_factory=dict)   # name -> model.shape_from_args kwargs
    configs: list[tuple[str, int]] = field(default_factory=list)      # (model name, tokens)
    steps: int = 6
    warmup: int = 2
    calibrate_only: bool = False
    profile: str = "loopback"
    sharding: str = "full"

    @property
    def where(self) -> str:
        return where(self.profile, self.sharding)


@dataclass(frozen=True)
class CheckpointSpec(RankSpec):
    """verify fsdp's checkpoint phase: the largest model, saved and loaded on every target per sharding."""

    phase: ClassVar[str] = "checkpoint"
    shape: dict[str, Any] = field(default_factory=dict)
    shardings: list[str] = field(default_factory=lambda: ["full"])
    reps: int = 9
    state_dicts: list[str] = field(default_factory=lambda: ["sharded"])
    targets: list[tuple[str, str]] = field(default_factory=list)      # (label, target text)


@dataclass(frozen=True)
class JobTiers:
    """Where a verify job's tiers are, as the launcher started them."""

    dir: str
    s3: dict[str, str] | None = None         # bucket and prefix on the embedded server
    mount: str | None = None                 # the cached mount's path
    mount_name: str | None = None
    ports: list[int] = field(default_factory=list)   # loopback servers a lab host reaches through the relay

    def root(self, tier: str) -> str:
        """A local tier's directory (dir, or the mount's)."""
        root = self.mount if tier == "mount" else self.dir
        assert root is not None, f"tier {tier} was not started"
        return root


@dataclass(frozen=True)
class JobSpec(RankSpec):
    """verify job, one link profile: calibrate (unless given), then every storage assignment."""

    phase: ClassVar[str] = "job"
    profile: str = "loopback"
    shape: dict[str, Any] = field(default_factory=dict)
    tokens: int = 256
    steps: int = 12
    ckpt_every: int | None = None
    async_ckpt: bool = False
    batch_size: int = 8
    sample_bytes: int = 4096
    workers: int = 1
    tiers: JobTiers = field(default_factory=lambda: JobTiers(dir=""))
    assignments: list[Assignment] = field(default_factory=list)

    @property
    def where(self) -> str:
        return self.profile


def where(profile: str, sharding: str | None) -> str:
    """A step phase's name: its link profile, and its sharding beside full ("1gbit hybrid")."""
    return profile if sharding in (None, "full") else f"{profile} {sharding}"


PHASES: dict[str, type[RankSpec]] = {cls.phase: cls for cls in (StepsSpec, CheckpointSpec, JobSpec)}


def dumps(spec: RankSpec) -> str:
    return json.dumps({"phase": spec.phase, **dataclasses.asdict(spec)})


def loads(text: str) -> RankSpec:
    data = json.loads(text)
    cls = PHASES[data.pop("phase")]
    return _build(cls, data)


def _build(hint: Any, value: Any) -> Any:
    """`value` as JSON gave it, rebuilt as `hint` says: dataclasses, tuples, lists and dicts of them."""
    if value is None:
        return None
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        hints = typing.get_type_hints(hint)
        return hint(**{f.name: _build(hints[f.name], value[f.name]) for f in dataclasses.fields(hint)
                       if f.init and f.name in value})
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return _build(inner[0], value) if len(inner) == 1 else value
    if origin is tuple:
        return tuple(_build(a, v) for a, v in zip(args, value, strict=False))
    if origin is list:
        return [_build(args[0], v) for v in value]
    if origin is dict:
        return {k: _build(args[1], v) for k, v in value.items()}
    return value
