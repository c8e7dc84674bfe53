"""Sweeps, warm-up, timing, statistics, progress and records: written once for every probe."""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field, is_dataclass
from pathlib import Path
from typing import Any, Callable, NoReturn

from ..core.errors import Interrupted, MicrobenchError, OutputClosed, ProbeUnavailable, RunError
from ..core.options import recorded
from ..core.probe import Case, Probe, RankGroup, Timed
from ..core.progress import Progress
from ..core.stats import percentile, summarize_us
from ..results import RecordWriter, new_record
from ..world import environment as envmod, interrupts
from ..world.dist import World
from .failures import dead_peers, diagnose, wrapped


@dataclass
class SweepSettings:
    warmup: int = 5
    iters: int = 20
    # Large sizes are capped to this many seconds of timed work per case (never below
    # min_iters) so a 1M-4G sweep ends in minutes; the row records the iterations it ran.
    budget_s_per_case: float | None = 2.0
    min_iters: int = 3
    check: bool = True
    progress: bool | None = None  # None: only when stderr is a terminal


@dataclass
class RunOutcome:
    record: dict[str, Any]
    path: Path | None
    rows: list[dict[str, Any]]
    notes: dict[str, Any] = field(default_factory=dict)   # what a probe's run tells its printer


def _iterations(settings: SweepSettings, warm_times: list[float]) -> int:
    if not settings.budget_s_per_case or not warm_times:
        return settings.iters
    per_iter = max(min(warm_times), 1e-9)
    return int(max(settings.min_iters, min(settings.iters, math.floor(settings.budget_s_per_case / per_iter))))


# How a row's iterations were timed (the row's "timing"):
TIMING_HOST = "host_clock"     # perf_counter around run_once + sync, every iteration
TIMING_EVENTS = "cuda_events"  # a CUDA event pair around each iteration, one synchronize per batch
TIMING_PROBE = "probe"         # the probe timed itself (run_once returned Timed)


def timing_method(device: Any, cuda_available: bool) -> str:
    """CUDA events for a case whose work runs on a GPU stream, else the host clock. A
    synchronize per iteration costs 10-20 us and biases small GPU cases low against nccl-tests,
    which times a batch of iterations per synchronize; events keep per-iteration times (and so
    the percentiles) without one."""
    if device is None or not cuda_available:
        return TIMING_HOST
    kind = getattr(device, "type", None) or str(device).split(":")[0]
    return TIMING_EVENTS if kind == "cuda" else TIMING_HOST


def _cuda_available() -> bool:
    from ..world.backends import cuda_usable

    return cuda_usable()


def _new_cuda_event() -> Any:
    import torch

    return torch.cuda.Event(enable_timing=True)


def _time_with_events(probe: Probe, case: Case, iters: int) -> tuple[list[float], list[dict[str, Any]], str]:
    """Every iteration between two events on the current stream, then one synchronize for the
    batch; elapsed_time is in milliseconds."""
    pairs: list[Any] = []
    extras: list[Any] = []
    for _ in range(iters):
        start, end = _new_cuda_event(), _new_cuda_event()
        start.record()
        out = probe.run_once(case)
        end.record()
        if isinstance(out, Timed):  # a probe that times itself after all: its figure stands
            probe.sync()
            return [out.time_s] + [_time_once(probe, case)[0] for _ in range(iters - 1)], [out.extra], TIMING_PROBE
        pairs.append((start, end))
        extras.append({})
    probe.sync()
    return [start.elapsed_time(end) / 1e3 for start, end in pairs], extras, TIMING_EVENTS


def _time_once(probe: Probe, case: Case) -> tuple[float, dict[str, Any]]:
    start = time.perf_counter()
    out = probe.run_once(case)
    probe.sync()
    elapsed = time.perf_counter() - start
    if isinstance(out, Timed):
        return out.time_s, out.extra
    return elapsed, {}


def _warm_up(probe: Probe, case: Case, settings: SweepSettings, world: RankGroup | None) -> list[float]:
    """Warm-up iterations. After the first, a slow case stops warming once half the per-case
    budget is spent: one 256M gloo all_reduce takes ~0.3 s, and five of them would cost more
    than the timed part. Rank 0 decides, so every rank runs the same collectives."""
    if settings.warmup <= 0:
        return []
    warm = [_time_once(probe, case)[0]]
    more = settings.warmup - 1
    if more and settings.budget_s_per_case:
        more = min(more, int(settings.budget_s_per_case / 2 / max(warm[0], 1e-9)))
    if world is not None:
        more = world.broadcast_object(more)
    warm.extend(_time_once(probe, case)[0] for _ in range(more))
    return warm


def measure_case(probe: Probe, case: Case, settings: SweepSettings, world: RankGroup | None) -> dict[str, Any]:
    """Run one case on this rank and return its row (complete on every rank)."""
    probe.prepare(case)
    try:
        warm = _warm_up(probe, case, settings, world)
        iters = _iterations(settings, warm)
        if world is not None:
            iters = world.broadcast_object(iters)  # every rank must run the same count
        device = probe.timed_on(case)
        timing = timing_method(device, device is not None and _cuda_available())
        times: list[Any] = []
        extras: list[Any] = []
        if timing == TIMING_EVENTS:
            times, extras, timing = _time_with_events(probe, case, iters)
        else:
            for _ in range(iters):
                start = time.perf_counter()
                out = probe.run_once(case)
                probe.sync()
                elapsed = time.perf_counter() - start
                if isinstance(out, Timed):
                    elapsed, timing = out.time_s, TIMING_PROBE
                times.append(elapsed)
                extras.append(out.extra if isinstance(out, Timed) else {})
        later = probe.checked_by(case) if settings.check else None
        nwrong = probe.check(case) if settings.check and later is None else 0
    except BaseException:
        # This rank leaves the case early (Ctrl-C, an error); its peers may be inside any
        # collective of the case, and one entered here would wait on them until the timeout.
        probe.abandon(case)
        raise
    probe.release(case)

    per_rank = world.all_gather_object((times, nwrong)) if world is not None else [(times, nwrong)]
    stats, slowest, medians_us = aggregate_ranks([t for t, _ in per_rank])
    row: dict[str, Any] = {
        "probe": probe.name,
        "op": case.op,
        "size_bytes": case.size_bytes,
        **dict(case.params),
        **probe.row_fields(case),
        "iters": iters,
        "warmup": len(warm),
        "timing": timing,
        "time_us": stats,
        "slowest_rank": slowest,
        "per_rank_time_us_p50": medians_us,
        "nwrong": sum(w for _, w in per_rank) if settings.check and later is None else None,
        **({"checked_by": later} if later else {}),
    }
    row.update(probe.metrics(case, stats["p50"] / 1e6))
    if extras and extras[-1]:
        row.update(_merge_extras(extras))
    return row


def aggregate_ranks(per_rank_times_s: list[list[float]]) -> tuple[dict[str, float], int, list[float]]:
    """time_us for a case from every rank's iteration times (seconds): each statistic is the
    maximum over ranks of that rank's own statistic. A step waits for its slowest rank, so a
    rank's own figures only bound the step from below; nccl-tests reports the slowest rank's
    time the same way (max over ranks of each rank's average). One rule for every statistic
    keeps min <= p50 <= p95 <= p99 <= max true of the record as it is of each rank.
    Returns (time_us, the rank with the largest median, every rank's median in us)."""
    summaries = [summarize_us(times) for times in per_rank_times_s]
    stats = {key: max(s[key] for s in summaries) for key in summaries[0]}
    medians_us = [s["p50"] for s in summaries]
    slowest = max(range(len(summaries)), key=lambda r: medians_us[r])
    return stats, slowest, medians_us


def _merge_extras(extras: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-iteration extras: numbers are reported as their median over iterations."""
    merged: dict[str, Any] = {}
    for key in extras[-1]:
        values = [e[key] for e in extras if key in e]
        if values and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            merged[key] = percentile(values, 50)
        else:
            merged[key] = values[-1]
    return merged


class _InterruptGuard:
    """Ctrl-C or SIGTERM during a sweep: raise KeyboardInterrupt where the sweep is, but never
    inside the handling that saves the partial record (interrupts.handler counts later signals
    without raising). A peer that got the same signal may leave first and make our collective
    fail; `settle` then tells that failure apart from a dead peer."""

    def __init__(self) -> None:
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> "_InterruptGuard":
        self._previous = interrupts.take()
        return self

    def settle(self) -> bool:
        """Let a signal that arrived during a blocking C call run its handler; True if hit.
        (Python runs signal handlers at the next call boundary, i.e. inside this call.)"""
        return interrupts.pending()

    def __exit__(self, *exc: Any) -> None:
        interrupts.restore(self._previous)


def config_dict(config: Any) -> dict[str, Any]:
    """The resolved config as the record keeps it: run-only flags (where to write, the lab,
    --timeout) are left out, as they were before flags came from the Config."""
    return recorded(config) if is_dataclass(config) else dict(config)


def run_probe(probe: Probe, settings: SweepSettings, *, config: Any, world: World | None = None,
              json_path: str | None = None, results_dir: str = "results",
              on_row: Callable[[dict[str, Any]], None] | None = None,
              extra_implementation: dict[str, Any] | None = None,
              extra_summary: dict[str, Any] | None = None) -> RunOutcome:
    """Sweep every case of `probe`, keeping the record on disk current after each case.

    Only rank 0 writes. On a failure or Ctrl-C, the finished rows stay in the file, status
    "partial", and the error is re-raised with the file named in its message.
    """
    is_writer = world is None or world.rank == 0
    settings_config = {"probe": config_dict(config), "sweep": asdict(settings)}
    try:
        reason = probe.unavailable_reason()
        if reason:
            raise ProbeUnavailable(reason)
        cases = probe.cases()
        implementation = {**envmod.native.implementation(), **probe.implementation(), **(extra_implementation or {})}
    except ProbeUnavailable as exc:
        skip(probe.name, str(exc), config, settings, world=world, json_path=json_path, results_dir=results_dir,
             implementation=extra_implementation)
    record = _probe_record(probe.name, settings_config, world, implementation, is_writer)
    writer = RecordWriter(record, json_path, results_dir) if is_writer else None
    rows: list[dict[str, Any]] = []
    progress = Progress(len(cases), probe.name, settings.progress if is_writer else False)
    current = None
    with _InterruptGuard() as guard:
        try:
            for case in cases:
                current = case
                interrupts.check()  # a signal whose first raise a library swallowed
                progress.step(case.label)
                row = measure_case(probe, case, settings, world)
                for earlier in rows:  # a case whose output this case's check has just read
                    if earlier.get("checked_by") == row["op"] and earlier["nwrong"] is None:
                        earlier["nwrong"] = row["nwrong"]
                rows.append(row)
                if writer:
                    writer.add_rows([row], complete=True)
                if on_row and is_writer:
                    on_row(row)
                progress.advance(row)
            current = None
            record["summary"] = {**probe.summarize(rows), **(extra_summary or {})}
            # Some facts are only known after running (the transport NCCL really picked).
            record["implementation"].update(probe.implementation())
            if writer:
                writer.finish("complete")
            return RunOutcome(record, writer.path if writer else None, rows)
        except KeyboardInterrupt:
            progress.close()
            raise Interrupted(_partial_message("interrupted", current, writer)) from None
        except ProbeUnavailable as exc:  # found out only on the way (a library that fails to load)
            progress.close()
            if writer:
                writer.finish("partial" if rows else "skipped", str(exc))
            raise
        except MicrobenchError as exc:
            progress.close()
            if isinstance(exc, RunError) and guard.settle():
                # A peer that got the same signal left first and broke our operation. An
                # Interrupted of the probe's own keeps its words (how far a drain got).
                reason = str(exc) if isinstance(exc, Interrupted) else "interrupted"
                raise Interrupted(_partial_message(reason, current, writer)) from None
            message = str(exc)
            if world is not None and isinstance(exc, RunError):
                # A probe's own error (a DCP save, a socket) is often how a dead peer shows: name it.
                dead = dead_peers(world, message)
                if dead and dead not in message:
                    message = f"{dead}{f' during {current.label}' if current else ''}; {message}"
            if writer:
                writer.finish("partial", message)
            raise type(exc)(_partial_message(message, None, writer, finish=False)) from None
        except (SystemExit, GeneratorExit):
            raise
        except OutputClosed:
            if writer:
                writer.finish("partial", f"{OutputClosed.reason}{f' during {current.label}' if current else ''}")
            raise
        # A collective that failed because a peer died or timed out; BaseException because some
        # libraries' errors are one (torch's CheckpointException).
        except BaseException as exc:
            progress.close()
            if guard.settle():
                raise Interrupted(_partial_message("interrupted", current, writer)) from None
            inner = wrapped(exc)
            where = f" during {current.label}" if current else ""
            reason = f"{inner}{where}" if inner else diagnose(exc, world, where)
            raise RunError(_partial_message(reason, None, writer)) from None
        finally:
            progress.close()


def _probe_record(kind: str, config: dict[str, Any], world: World | None, implementation: dict[str, Any],
                  is_writer: bool) -> dict[str, Any]:
    record = new_record(kind, config, envmod.collect() if is_writer else {}, implementation)
    if world is not None:
        record["config"]["world"] = {"size": world.size, "backend": world.backend, "launcher": world.spec.launcher}
    return record


def skip(kind: str, reason: str, config: Any, settings: SweepSettings, *, world: World | None = None,
         json_path: str | None = None, results_dir: str = "results",
         implementation: dict[str, Any] | None = None) -> NoReturn:
    """A probe that cannot run here: rank 0 writes its record (status "skipped", status_reason
    the reason, no rows), then ProbeUnavailable(reason) ends the run (the CLI exits 0).
    run_probe calls it for every probe whose unavailable_reason says no or that raises
    ProbeUnavailable before its first case; a command that must know before it sets something
    up (a run directory, a server) calls it itself, so every skip leaves the same record."""
    if world is None or world.rank == 0:
        settings_config = {"probe": config_dict(config), "sweep": asdict(settings)}
        impl = {**envmod.native.implementation(), **(implementation or {})}
        RecordWriter(_probe_record(kind, settings_config, world, impl, True), json_path, results_dir).finish(
            "skipped", reason)
    exc = ProbeUnavailable(reason)
    exc.recorded = True  # type: ignore[attr-defined]  # the command wrapper must not write another
    raise exc


def _partial_message(reason: str, case: Case | None, writer: RecordWriter | None, finish: bool = True) -> str:
    where = f" during {case.label}" if case else ""
    if writer is None:
        return f"{reason}{where}"
    if finish:
        writer.finish("partial", f"{reason}{where}")
    if writer.failed and not writer.path.exists():
        return f"{reason}{where}"  # nothing could be written: the claimed name is gone again
    return f"{reason}{where}; kept {writer.saved_rows} finished case(s) in {writer.path} (partial)"
