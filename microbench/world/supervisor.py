"""Local worlds: how many ranks this machine can run, and watching the ranks a launcher started.

The supervisor is where "never hang, always say why, keep the record" holds for a local launch:
it forwards one interrupt, ends a world whose rank 0 failed, froze or was killed, and marks the
record rank 0 claimed partial when rank 0 could not.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Any

from ..core.errors import UsageError
from . import stacks

# What one local rank costs at the least: Python, torch and a gloo group take about 210 MiB
# resident before any buffer; a rank runs a dozen threads (heartbeat, gloo, intra-op).
RANK_MEMORY_BYTES = 256 << 20
TASKS_PER_RANK = 16
# Ranks time themselves; beyond a few per core they mostly wait for a CPU, and a world of
# hundreds takes minutes to start and to stop.
RANKS_PER_CORE = 8


def local_world_limit() -> tuple[int, str]:
    """The most local ranks this machine can run, and the rule that gave it: the smallest of
    RANKS_PER_CORE per usable core, available memory / RANK_MEMORY_BYTES, and the process
    limit (RLIMIT_NPROC, kernel threads-max) / TASKS_PER_RANK."""
    import resource

    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    limits = [(RANKS_PER_CORE * cores, f"{RANKS_PER_CORE} per CPU core x {cores} core(s)")]
    available = _mem_available_bytes()
    if available is not None:
        limits.append(
            (
                available // RANK_MEMORY_BYTES,
                f"{available / (1 << 30):.1f} GiB available / {RANK_MEMORY_BYTES >> 20} MiB per rank",
            )
        )
    soft, _ = resource.getrlimit(resource.RLIMIT_NPROC)
    if soft != resource.RLIM_INFINITY:
        limits.append((soft // TASKS_PER_RANK, f"RLIMIT_NPROC {soft} / {TASKS_PER_RANK} tasks per rank"))
    try:
        with open("/proc/sys/kernel/threads-max") as handle:
            threads_max = int(handle.read())
        limits.append((threads_max // TASKS_PER_RANK, f"threads-max {threads_max} / {TASKS_PER_RANK} tasks per rank"))
    except (OSError, ValueError):
        pass
    limit, rule = min(limits)
    return max(1, limit), rule


def _mem_available_bytes() -> int | None:
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def check_local_world(nproc: int) -> None:
    """Refuse a local world this machine cannot run (exit 2), before any rank starts. Worlds a
    launcher (torchrun, srun, mpirun) made are its business, never checked here."""
    limit, rule = local_world_limit()
    if nproc > limit:
        raise UsageError(
            f"invalid --nproc {nproc}: this machine runs at most {limit} local ranks ({rule}); "
            f"use --nproc {limit} or fewer, or start ranks on several hosts "
            f"with torchrun/srun/mpirun"
        )


# After Ctrl-C, ranks that have not yet claimed a record (still starting, joining) have nothing
# to save; they are given this long before they are stopped.
STARTUP_GRACE_S = 5.0
# A rank stopped this long past --timeout is given up on (Supervisor._stopped_too_long).
STOPPED_GRACE_S = 3.0


class Supervisor:
    """Waits for the ranks; forwards an interrupt; ends a world whose rank 0 failed, froze or
    was killed; says, in one line, what rank 0 could not say itself."""

    def __init__(
        self,
        procs: list[subprocess.Popen],
        logs: list[Any],
        timeout_s: float,
        signals: list[int],
        note: str,
        stacks_dir: str | None = None,
    ):
        self.procs, self.logs, self.timeout_s, self.signals, self.note = procs, logs, timeout_s, signals, note
        self.stacks_dir = stacks_dir  # where armed ranks write their stacks (world/stacks.py)
        self.ended: dict[int, tuple[str, str]] = {}  # rank -> (why we ended it, its Python stacks)
        self.asked: set[int] = set()  # ranks asked for their stacks: once each
        self.interrupted_at: float | None = None
        self.first_failure_at: float | None = None
        self.killed_rank0: str | None = None  # why we had to kill rank 0
        self.signalled: set[int] = set()
        self.stopped_since: dict[int, float] = {}
        self.stopped_line: str | None = None  # a rank stopped past --timeout: the run's one line

    def _notes(self) -> list[str]:
        try:
            with open(self.note) as handle:
                return [line.strip() for line in handle if line.strip()]
        except OSError:
            return []

    def record(self) -> str | None:
        paths = [line for line in self._notes() if not line.startswith("ready ")]
        return paths[-1] if paths else None

    def _forward_interrupt(self) -> None:
        """SIGINT, once, to every rank that is ready for it; one still inside interpreter start-up
        gets it when it reports ready (or is stopped after the grace)."""
        ready = {int(line.split()[1]) for line in self._notes() if line.startswith("ready ")}
        for rank, proc in enumerate(self.procs):
            if rank in ready and rank not in self.signalled and proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                self.signalled.add(rank)

    def _kill_all(self, why_rank0: str) -> None:
        if self.procs[0].poll() is None:
            self.killed_rank0 = why_rank0
        if self.stacks_dir:
            # Where each rank still running was: the one account of a hang that its peers' errors
            # (a collective's timeout) cannot give. A stopped rank cannot answer, and one already
            # asked is dying (this runs every tick until the killed ranks are reaped): not asked.
            live = [
                (rank, p)
                for rank, p in enumerate(self.procs)
                if rank not in self.asked and p.poll() is None and not _stopped(p.pid)
            ]
            self.asked.update(rank for rank, _ in live)
            for rank, text in stacks.ask(live, self.stacks_dir).items():
                self.ended[rank] = (why_rank0, text)
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()

    def _tick(self) -> None:
        codes = [proc.poll() for proc in self.procs]
        now = time.monotonic()
        if self.signals and self.interrupted_at is None:
            self.interrupted_at = now
        if self.interrupted_at is not None:
            self._forward_interrupt()
            # Rank 0 saves its partial record and leaves; one still starting has nothing to save.
            grace = self.timeout_s + 5 if self.record() else STARTUP_GRACE_S
            if now - self.interrupted_at > grace:
                self._kill_all(f"did not stop within {grace:g} s of the interrupt")
            return
        if self.first_failure_at is None and any(code not in (None, 0) for code in codes):
            self.first_failure_at = now
        if self._stopped_too_long(codes, now):
            return
        if self.first_failure_at is None:
            return
        # Survivors of a dead peer end by themselves within --timeout; past that they hang.
        # Once rank 0 (the one that reports and writes the record) has failed, the others have
        # nothing left to say: a moment to leave by themselves, then they go too. A rank 0 that is stopped
        # (SIGSTOP, a debugger) will never answer: no grace.
        if codes[0] not in (None, 0):
            grace = 0.0 if any(_stopped(p.pid) for p in self.procs if p.poll() is None) else 0.5
        elif _stopped(self.procs[0].pid):
            grace = 0.0
        else:
            grace = self.timeout_s + 3
        if now - self.first_failure_at > grace:
            self._kill_all(
                "stopped responding" if grace == 0.0 else f"did not end within {grace:g} s of another rank's failure"
            )

    def _stopped_too_long(self, codes: list[int | None], now: float) -> bool:
        """A rank stopped (SIGSTOP, a debugger) for more than --timeout ends the world: its peers
        notice only at their next collective, which may be a whole case of local passes away
        (a DataLoader pass per iteration), and a stopped rank never answers anyway. A few
        seconds' grace past --timeout let a peer blocked on it say so first (it names the case)."""
        stopped = [rank for rank, proc in enumerate(self.procs) if codes[rank] is None and _stopped(proc.pid)]
        self.stopped_since = {rank: self.stopped_since.get(rank, now) for rank in stopped}
        late = [rank for rank, since in self.stopped_since.items() if now - since > self.timeout_s + STOPPED_GRACE_S]
        if not late:
            return False
        self.stopped_line = (
            f"rank {', '.join(map(str, late))} stopped (SIGSTOP or a debugger) for more than "
            f"--timeout {self.timeout_s:g} s"
        )
        self._kill_all(f"was stopped for more than --timeout {self.timeout_s:g} s")
        return True

    def run(self) -> int:
        while any(proc.poll() is None for proc in self.procs):
            self._tick()
            time.sleep(0.05)
        rank0 = self.procs[0].returncode
        record = self.record()
        if record and self.ended:
            from ..results.store import add_ended_ranks

            add_ended_ranks(record, self.ended)
        if self.interrupted_at is not None:
            if rank0 < 0:
                reason = f"interrupted; rank 0 {self.killed_rank0 or f'was killed by {_signal_name(-rank0)}'}"
                return self._fail(reason, record)
            if rank0 == 0:
                print("microbench: interrupted after the ranks finished; the run is complete", file=sys.stderr)
                return 1
            return rank0  # rank 0 said why itself
        if self.stopped_line:
            return self._fail(self.stopped_line, record)
        if rank0 < 0:
            # Killed by a signal (or by us, for freezing): rank 0 could not say why itself. A
            # rank that saw it go silent says it best.
            said = self._failed_rank_line() if self.killed_rank0 else None
            reason = said or f"rank 0 {self.killed_rank0 or f'was killed by {_signal_name(-rank0)}'}"
            return self._fail(reason, record)
        if rank0 != 0:
            return rank0
        line = self._failed_rank_line()
        if line:
            print(f"microbench: {line}", file=sys.stderr)
            return 1
        return 0

    def _failed_rank_line(self) -> str | None:
        for rank, proc in enumerate(self.procs[1:], start=1):
            if proc.returncode not in (0, None) and proc.returncode > 0:
                self.logs[rank].seek(0)
                lines = [line.strip() for line in self.logs[rank].read().splitlines() if line.strip()]
                why = lines[-1] if lines else f"exit code {proc.returncode}"
                return f"rank {rank} failed: {why.removeprefix('microbench: ')}"
        return None

    def _fail(self, reason: str, record: str | None) -> int:
        from ..results.store import mark_abandoned

        if record and mark_abandoned(record, reason):
            reason += f"; the finished cases are kept in {os.path.relpath(record)} (partial)"
            if self.ended:
                reason += f", with the Python stacks of rank {', '.join(map(str, sorted(self.ended)))} as it was ended"
        print(f"microbench: {reason}", file=sys.stderr)
        return 1


def _stopped(pid: int) -> bool:
    """True when the process is stopped (SIGSTOP, SIGTSTP, a tracer): it will not answer."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] in ("T", "t")
    except (OSError, IndexError):
        return False


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
