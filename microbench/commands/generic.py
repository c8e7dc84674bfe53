"""The command of every registered probe, made from its spec: the probe's flags from its Config
(core/options.py), the flags its needs bring where the Config does not declare them, the sweep
flags with the spec's defaults. The command parses them into the Config and an Invocation, lets
the spec's validate hook refuse misuse before anything is set up, calls the probe's run and
prints with its printer. On a lab (`--lab`), the command places the ranks: a probe knows
nothing of the lab."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import tempfile
from typing import Any

from ..core import options
from ..core.errors import ProbeUnavailable, RunError, UsageError
from ..core.registry import ProbeSpec
from ..core.tables import text_table
from ..core.units import format_size, parse_number
from ..run.invocation import Invocation, run_spec
from .common import add_sweep_options, settings_from_args, write_outputs


def add_probe_parser(sub: argparse._SubParsersAction, name: str, spec: ProbeSpec) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help=spec.help, description=spec.description or spec.help)
    declared = {f.flag for f in options.flags(spec.config)}
    try:
        g = p.add_argument_group("probe")
        for flag in options.flags(spec.config):
            options.add_flag(g, flag)
        if (
            any(
                f.opt.parse is options.sweep or (f.opt.parse is None and f.kind == "sizes")
                for f in options.flags(spec.config)
            )
            and "--factor" not in declared
        ):
            g.add_argument("--factor", default="2", help="step between sizes of a range, e.g. 1M-64M (default 2)")
        if spec.sweep.check_flag and "--check" not in declared:
            g.add_argument(
                "--check",
                action=argparse.BooleanOptionalAction,
                default=spec.sweep.check,
                help=f"verify every result element against the known pattern "
                f"(default {'on' if spec.sweep.check else 'off'})",
            )
        _add_needs(p, spec, declared)
        add_sweep_options(p, warmup=spec.sweep.warmup, iters=spec.sweep.iters, budget_s=spec.sweep.budget_s)
    except argparse.ArgumentError as exc:
        raise UsageError(
            f"probe {spec.name!r}: a Config field clashes with a shared option ({exc}); expected "
            f"other field names than the sweep and output options (e.g. not iters or json)"
        ) from None
    p.set_defaults(handler=functools.partial(_skips_recorded, spec, functools.partial(run, spec)))
    return p


def _add_needs(p: argparse.ArgumentParser, spec: ProbeSpec, declared: set[str]) -> None:
    """The flags a spec's needs bring, for a probe whose Config does not declare its own. Only
    the generic runner reads them: a probe with its own run declares every flag it takes."""
    if spec.run is not None:
        return
    wanted: list[tuple[str, dict[str, Any]]] = []
    if spec.needs.target:
        wanted += [
            (
                "--path",
                dict(
                    default=tempfile.gettempdir(),
                    help="directory to write under; a unique "
                    "directory is created there and removed afterwards (default: the temp dir)",
                ),
            ),
            ("--keep", dict(action="store_true", help="keep the run's directory afterwards")),
        ]
    if spec.needs.s3:
        from ..targets.s3server import DEFAULT_BUCKET

        wanted += [
            ("--endpoint", dict(metavar="URL", help="S3 endpoint (default: an embedded server for the run)")),
            (
                "--bucket",
                dict(
                    help=f"existing bucket (default {DEFAULT_BUCKET!r} on the embedded server; "
                    f"required with --endpoint)"
                ),
            ),
        ]
    if spec.needs.world:
        wanted += [
            (
                "--nproc",
                dict(
                    default=None,
                    help="local ranks to spawn when not launched by torchrun/srun/"
                    "mpirun (default: number of GPUs, else 2)",
                ),
            ),
            ("--timeout", dict(default="60", help="seconds before a silent peer fails the run (default 60)")),
        ]
    wanted = [(flag, kw) for flag, kw in wanted if flag not in declared]
    if wanted:
        g = p.add_argument_group("needs")
        for flag, kw in wanted:
            g.add_argument(flag, dest=f"needs_{flag[2:]}", **kw)


def _skips_recorded(spec: ProbeSpec, handler: Any, args: argparse.Namespace) -> int:
    """A probe that finds out it cannot run before its sweep starts (no torch, no S3 client, no
    GPU, fio missing) still leaves its skipped record, as one that the runner skips does. Only the
    process that owns the record writes it: the launcher or a launcher's rank 0, never a rank we
    spawned (its launcher answers for it)."""
    try:
        return handler(args)
    except ProbeUnavailable as exc:
        if not getattr(exc, "recorded", False) and _owns_the_record():
            from ..run.runner import SweepSettings, skip

            try:
                settings = settings_from_args(args)
            except Exception:
                settings = SweepSettings()
            skip(
                spec.name,
                str(exc),
                {},
                settings,
                json_path=getattr(args, "json", None),
                results_dir=getattr(args, "results_dir", "results"),
            )
        raise


def _owns_the_record() -> bool:
    from ..world.launch import RANK_VARIABLES, SPAWNED_ENV

    return not os.environ.get(SPAWNED_ENV) and all(os.environ.get(v, "0") == "0" for v in RANK_VARIABLES)


# --------------------------------------------------------------------------- flags -> Config


def config_options(config: type | None) -> list[options.Flag]:
    """The flags a Config makes (core/options.py)."""
    return options.flags(config)


def build_config(spec: ProbeSpec, args: argparse.Namespace) -> Any:
    """The Config from the command line: the flags given, parsed once (core/units.py), and the
    dataclass's defaults for the rest. Needs flags the Config does not declare stay in args."""
    if spec.config is None:
        return {}
    factor = 2.0
    given_factor = getattr(args, "factor", None)
    if given_factor is not None:
        factor = parse_number(given_factor, what="--factor", example="2", minimum=1.0, allow_minimum=False)
    values = {}
    for flag in options.flags(spec.config):
        given = getattr(args, flag.dest, None)
        if given is None:
            continue
        values[flag.name] = flag.value(given, factor)
    return spec.config(**values)


def invocation(spec: ProbeSpec, args: argparse.Namespace, config: Any) -> Invocation:
    check = spec.sweep.check
    if spec.sweep.check_flag:
        check = bool(getattr(config, "check", getattr(args, "check", check)))
    return Invocation(settings=settings_from_args(args, check=check), json_path=args.json, results_dir=args.results_dir)


def _lab_placement(spec: ProbeSpec, config: Any, inv: Invocation) -> None:
    """--lab: one rank per lab host (or the pair a link probe names), failures named by host."""
    from ..world.launch import detect_world

    name = getattr(config, "lab", None)
    if not name or not spec.needs.world:
        return
    from ..lab import namespaces, placement

    inv.naming = functools.partial(placement.naming_lab_hosts, name)
    inv.diagnose = functools.partial(namespaces.diagnose, name)
    inv.facts.update(placement.lab_facts())
    if detect_world() is None:
        pair = getattr(config, "pair", None)
        if pair is None and hasattr(config, "pair"):
            # A probe between two hosts (link): hosts 0 and 1, one rank each, however many
            # ranks the lab places per host (two ranks of one host would meet over its loopback).
            pair = [0, 1]
        inv.placement = placement.place(name, nproc=getattr(config, "nproc", None), pair=pair)


def checked_config(spec: ProbeSpec, args: argparse.Namespace) -> Any:
    """The Config the probe will run, every flag parsed and the spec's validate hook passed:
    misuse refused before anything is set up (the suite checks its steps' arguments so too)."""
    config = build_config(spec, args)
    for key in ("path", "keep", "endpoint", "bucket", "nproc", "timeout"):
        if hasattr(args, f"needs_{key}") and not hasattr(config, key):
            # a needs flag the Config does not declare: the runner reads it from here
            config = _with_needs(config, key, getattr(args, f"needs_{key}"))
    if spec.validate is not None:
        config = spec.validate(config)
    return config


def run(spec: ProbeSpec, args: argparse.Namespace) -> int:
    config = checked_config(spec, args)
    inv = invocation(spec, args, config)
    if getattr(config, "link_profiles", None):
        from ..lab import placement
        from ..world.launch import detect_world

        if detect_world() is None:
            return placement.run_profiles(spec, config, inv)
    _lab_placement(spec, config, inv)
    outcome = run_spec(spec, config, inv)
    if outcome is None:  # a launcher or another rank: rank 0 has reported
        return inv.exit_code
    failure = None
    if spec.printer is not None:
        failure = spec.printer(outcome, config)  # a printer may name what failed (wrong elements)
    else:
        print_table(spec, outcome.rows)
        print(f"# results: {outcome.path}")
    write_outputs(args, outcome)
    if failure:
        raise RunError(failure)
    return 0


def _with_needs(config: Any, key: str, value: Any) -> Any:
    from ..core.units import parse_positive_int, parse_timeout

    if key == "nproc" and value is not None:
        value = parse_positive_int(value, what="--nproc", example="2")
    if key == "timeout":
        key, value = "timeout_s", parse_timeout(value)
    # The runner reads needs from the Config's attributes (object.__setattr__: a frozen one too).
    if dataclasses.is_dataclass(config):
        object.__setattr__(config, key, value)
    return config


def print_table(spec: ProbeSpec, rows: list[dict[str, Any]]) -> None:
    """op, size, time p50 and the spec's metrics that the rows carry."""
    metrics = [m for m in spec.metrics if any(isinstance(r.get(m), (int, float)) for r in rows)]
    table = [
        (
            r.get("op", "-"),
            format_size(r.get("size_bytes", 0)),
            f"{r['time_us']['p50']:.1f}",
            *("-" if r.get(m) is None else f"{r[m]:.3f}" for m in metrics),
        )
        for r in rows
    ]
    print(text_table(table, headers=["op", "size", "time p50 (us)", *metrics], tablefmt="simple"))
