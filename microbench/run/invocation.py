"""One run of a probe as a library call: the typed input every probe command builds from its
flags (`Invocation`), and the run for a probe that needs nothing but what its spec declares.

A command parses its flags into the probe's Config and an Invocation, then calls
`run_spec(spec, config, invocation)`: the probe's own `spec.run` where it has one (a storage
target it opens itself, a world it shapes), else `default_run` below."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Callable, ContextManager

from ..core.errors import UsageError
from ..core.registry import ProbeSpec
from ..world.dist import World
from . import provision
from .runner import RunOutcome, SweepSettings, run_probe


@dataclass
class Placement:
    """Where local ranks run when not on this host's loopback (a lab's namespaces)."""

    nproc: int
    master_addr: str
    per_rank: Callable[[int], Any]


@dataclass
class Invocation:
    settings: SweepSettings = field(default_factory=SweepSettings)
    json_path: str | None = None
    results_dir: str = "results"
    argv: list[str] | None = None          # the command line ranks re-run; None: this process's
    # Set by the command layer for a world probe on a lab: rank placement, and how a failure is
    # named (which lab host lost its link). A probe knows nothing of the lab.
    placement: Placement | None = None
    naming: Callable[[Any], ContextManager[None]] | None = None
    diagnose: Callable[[], str | None] | None = None     # after a failure: whose fault, if known
    facts: dict[str, Any] = field(default_factory=dict)   # for the record's implementation (lab, ...)
    # What a launcher's world ended with (its rank 0's exit code, which has printed the reason).
    exit_code: int = 0

    def named(self, world: World) -> ContextManager[None]:
        return self.naming(world) if self.naming is not None else contextlib.nullcontext()


def run_spec(spec: ProbeSpec, config: Any, inv: Invocation) -> RunOutcome | None:
    """The outcome in the process that reports it (rank 0 of a world, or the one process);
    None in a launcher, whose rank 0 has printed, and in the other ranks."""
    if spec.run is not None:
        return spec.run(spec, config, inv)
    return default_run(spec, config, inv)


def _needs_view(config: Any) -> SimpleNamespace:
    """What provision.prepare reads (--path, --keep, --endpoint, --bucket) from the Config,
    where the probe declares those flags."""
    return SimpleNamespace(**{k: getattr(config, k, None) for k in ("path", "keep", "endpoint", "bucket")})


def default_run(spec: ProbeSpec, config: Any, inv: Invocation) -> RunOutcome | None:
    build = spec.build
    assert build is not None   # a probe without build brings its own run
    if not spec.needs.world:
        with provision.prepare(spec, _needs_view(config)) as context:
            probe = build(config, context)
            return run_probe(probe, inv.settings, config=config, json_path=inv.json_path,
                             results_dir=inv.results_dir, extra_implementation=context.facts)
    from ..world import backends
    from ..world.policy import in_world, local_ranks

    if spec.needs.s3:
        raise UsageError(f"probe {spec.name!r} needs a world and S3: the generic runner does not hand an "
                         f"embedded server to ranks; give the probe its own run (spec.run)")
    nproc = getattr(config, "nproc", None) or local_ranks()
    outcomes: list[RunOutcome] = []

    def body(world: World) -> int:
        with provision.prepare(spec, _needs_view(config)) as context:
            context.world = world
            probe = build(config, context)
            outcome = run_probe(probe, inv.settings, config=config, world=world, json_path=inv.json_path,
                                results_dir=inv.results_dir, extra_implementation=context.facts)
        if world.rank == 0:   # only rank 0 prints and writes
            outcomes.append(outcome)
        return 0

    inv.exit_code = in_world(
        nproc=nproc,
        timeout_s=getattr(config, "timeout_s", 60.0),
        choice=backends.choose("auto"),
        body=body,
        argv=inv.argv,
    )
    return outcomes[0] if outcomes else None
