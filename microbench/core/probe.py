"""The probe contract (nccl-tests' testColl meets fio's ioengine ops table).

A probe says why it can't run here (`unavailable_reason`), which cases it sweeps, and how to
run one case once; what it needs set up first (a world, a target, S3, a GPU) its registry
entry says (`registry.Needs`). It never loops, times, aggregates, prints or
writes: the runner does that once for every probe. Each probe owns its bandwidth formula and
documents its derivation in `metrics`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol


class RankGroup(Protocol):
    """The ranks a case runs over, as the runner and a probe's collectives see them: this rank's
    index and their number, and small object exchanges among them. world/dist.World is one; a
    sub-world of some of its ranks over a group of their own (lab/bisect.py's halves) is another."""

    rank: int
    size: int

    def all_gather_object(self, obj: Any) -> list[Any]: ...

    def broadcast_object(self, obj: Any) -> Any: ...

    def barrier(self) -> None: ...


@dataclass(frozen=True)
class Case:
    """One point of a sweep. `params` holds what else distinguishes it (placement, bs, rw...)."""

    op: str
    size_bytes: int
    params: tuple[tuple[str, Any], ...] = ()

    def param(self, name: str, default: Any = None) -> Any:
        return dict(self.params).get(name, default)

    @property
    def label(self) -> str:
        extra = " ".join(f"{k}={v}" for k, v in self.params)
        from .units import format_size

        return f"{self.op} {format_size(self.size_bytes)}{(' ' + extra) if extra else ''}"


@dataclass
class Timed:
    """What `run_once` returns when the probe measured time itself (e.g. a native engine that
    runs many I/Os); `extra` carries per-run metrics such as latency percentiles."""

    time_s: float
    extra: dict[str, Any] = field(default_factory=dict)


class Probe:
    name: ClassVar[str] = "probe"

    def unavailable_reason(self) -> str | None:
        """None when the probe can run here, else one line saying why not."""
        return None

    def implementation(self) -> dict[str, Any]:
        """What really ran: native or python, engine, transport, O_DIRECT in effect, ..."""
        return {}

    def cases(self) -> list[Case]:
        raise NotImplementedError

    def prepare(self, case: Case) -> None:
        """Allocate and fill buffers for the case; not timed."""

    def run_once(self, case: Case) -> Timed | None:
        """Do the operation once. Return None to let the runner time the call, or Timed."""
        raise NotImplementedError

    def sync(self) -> None:
        """Wait for asynchronous work (CUDA streams) so the runner's clock sees it finish."""

    def timed_on(self, case: Case) -> Any:
        """The CUDA device whose current stream runs this case's work, when run_once only
        enqueues GPU work and returns None: the runner then times each iteration with CUDA events
        and synchronizes once per batch (runner.timing_method). None (the default): the host
        clock around run_once + sync, per iteration."""
        return None

    def check(self, case: Case) -> int:
        """Number of wrong elements after a fresh run of the case; 0 when correct."""
        return 0

    def checked_by(self, case: Case) -> str | None:
        """The op of a later case whose check reads exactly what this case last wrote (a load
        after a save): this case's own check is skipped and its row's nwrong is that case's.
        Until that case's row exists (or if the run stops before it) nwrong stays None."""
        return None

    def metrics(self, case: Case, time_s: float) -> dict[str, Any]:
        """Bandwidths and rates for a case that took time_s (the slowest rank's median)."""
        return {}

    def release(self, case: Case) -> None:
        """Free what prepare allocated."""

    def abandon(self, case: Case) -> None:
        """release for a case this rank leaves early (Ctrl-C, an error): its peers may be in any
        collective of the case, so nothing here may wait on them. By default release, which
        frees local things only; a probe whose release synchronizes its ranks overrides this."""
        self.release(case)

    def row_fields(self, case: Case) -> dict[str, Any]:
        """Extra identifying columns for the result row (count, dtype, redop, ...)."""
        return {}

    def summarize(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        """Aggregates over all rows for the record's summary (fits, averages)."""
        return {}
