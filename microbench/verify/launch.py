"""One launcher for every verify world (`verify fsdp`'s step and checkpoint phases, `verify job`'s
link profiles): the phase's spec handed to `nproc` local ranks, placed on a lab's hosts or on
loopback; the launcher's guard that leaves the record partial, never "running", whatever ends a
phase early; and a rank's side: the spec read back, the world joined, the phase's body run.

verify launches its own worlds (one per link profile, reshaping the lab between them), so it
refuses to run under another launcher."""

from __future__ import annotations

import os
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, NoReturn, Sequence

from ..core.errors import Interrupted, UsageError
from ..results.store import RecordWriter, atomic_write_text, mark_abandoned
from ..world import backends, interrupts, load
from ..world.backends import BackendChoice
from ..world.dist import World
from ..world.launch import RankLaunch, detect_world
from ..world.policy import in_world
from . import spec as specs

# The command line each phase's ranks re-run, with --phase-spec FILE.
COMMANDS = {"steps": ("verify", "fsdp"), "checkpoint": ("verify", "fsdp"), "job": ("verify", "job")}


def refuse_in_world(command: str) -> None:
    if detect_world() is not None:
        raise UsageError(f"{command} launches its own ranks (a world per link profile); run it without "
                         f"torchrun/srun/mpirun")


def launch(spec: specs.RankSpec, choice: BackendChoice, *, lab: str | None = None,
           per_node: int | None = None, helpers: Sequence[int | None] = ()) -> int:
    """Run one phase on spec.nproc local ranks and return their exit code. lab: one rank per lab
    host slot (the lab's own placement); per_node: on loopback, but with local worlds of that many
    ranks, the nodes HSDP's mesh is built from. The record keeps what other processes took of the
    machine meanwhile (summary.load_by_phase[spec.where]; helpers: our servers' pids, not others')."""
    from ..lab import placement

    fd, path = tempfile.mkstemp(suffix=".json", prefix=f"microbench-verify-{spec.phase}-")
    os.close(fd)
    try:
        atomic_write_text(Path(path), specs.dumps(spec), mode=0o600)  # as mkstemp made it: this user's
        per_rank: Callable[[int], RankLaunch] | None = None
        master = "127.0.0.1"
        if lab:
            placed = placement.place(lab, nproc=spec.nproc)
            master, per_rank = placed.master_addr, placed.per_rank
        elif per_node:
            per_rank = _loopback_nodes(per_node)
        own = [p for p in helpers if p]
        before = load.read(own)
        code = in_world(nproc=spec.nproc, timeout_s=spec.timeout_s, choice=choice, body=lambda world: 0,
                        per_rank=per_rank, master_addr=master, argv=[*COMMANDS[spec.phase], "--phase-spec", path])
        if code == 0:
            seen = load.between(before, load.read(own))
            RecordWriter.resume(spec.record).update(
                lambda r: r["summary"].setdefault("load_by_phase", {}).__setitem__(spec.where, seen))
        return code
    finally:
        os.unlink(path)


def _loopback_nodes(per_node: int) -> Callable[[int], RankLaunch]:
    """Local ranks told they sit in nodes of per_node ranks (the launcher's LOCAL_* variables)."""
    def per_rank(rank: int) -> RankLaunch:
        return RankLaunch(env={"LOCAL_RANK": str(rank % per_node), "LOCAL_WORLD_SIZE": str(per_node)})
    return per_rank


def run_rank(path: str, body: Callable[[World, specs.RankSpec], int]) -> NoReturn:
    """A rank's side: join the world the spec describes, run body, then leave without the
    interpreter's teardown. A rank is done once its world is closed; tearing down gloo's threads
    can still abort ("terminate called without an active exception") and turn a finished phase
    into a failed rank."""
    spec = specs.loads(Path(path).read_text())
    code = in_world(nproc=spec.nproc, timeout_s=spec.timeout_s, choice=backends.choose(spec.backend),
                    body=lambda world: body(world, spec))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


@contextmanager
def partial_unless_finished(path: str | Path) -> Iterator[None]:
    """The launcher's guard over its ranks: whatever ends the run early (a signal, a failed phase,
    an error of its own) leaves the record partial with the reason and ended_at, never "running".
    A record already finished (a rank marked it partial with a better reason) is left alone."""
    try:
        yield
    except (KeyboardInterrupt, Interrupted):
        mark_abandoned(path, "interrupted (SIGINT or SIGTERM)")
        raise
    except BaseException as exc:
        mark_abandoned(path, (str(exc).strip().splitlines() or [type(exc).__name__])[0])
        raise


def left_partial(path: str | Path, code: int) -> int:
    """A phase whose ranks failed without marking the record (killed, or stopped by a signal the
    launcher took and forwarded to them): partial, saying which. Returns `code`."""
    # The launcher forwards a signal to its ranks and returns their exit code: say which it was.
    why = "interrupted (SIGINT or SIGTERM)" if interrupts.seen() else f"a verify phase failed (exit code {code})"
    mark_abandoned(path, f"{why}; the rows finished before are kept")
    return code
