"""The command of every registered probe. A probe with its own CLI module (`spec.cli`: module
attributes `add_options(parser)`, `run(args)` and optionally `DESCRIPTION`) gets its parser
from it; one without gets a generic command: options made from its Config dataclass, the shared
sweep and output options, and the runner's setup of what it needs (needs.py)."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import importlib
import types
import typing
from typing import Any

from tabulate import tabulate

from ..run import provision as needs
from ..core.errors import ProbeUnavailable, UsageError
from ..core.registry import ProbeSpec
from ..core.units import format_size, parse_number, parse_positive_int, parse_size, parse_sizes
from ..run.runner import run_probe
from .common import add_sweep_options, parse_timeout, settings_from_args, write_outputs


def add_probe_parser(sub: argparse._SubParsersAction, name: str, spec: ProbeSpec) -> argparse.ArgumentParser:
    if spec.cli:
        module = importlib.import_module(spec.cli)
        p = sub.add_parser(name, help=spec.help, description=getattr(module, "DESCRIPTION", None) or spec.help)
        module.add_options(p)
        p.set_defaults(handler=functools.partial(_skips_recorded, spec, module.run))
        return p
    p = sub.add_parser(name, help=spec.help, description=spec.help)
    try:
        options = config_options(spec.config)
        if options:
            g = p.add_argument_group("probe")
            for opt in options:
                opt.add_to(g)
            if any(o.kind == "sizes" for o in options) and not any(o.field == "factor" for o in options):
                g.add_argument("--factor", default="2", help="step between sizes of a range, e.g. 1M-64M (default 2)")
        needs.add_options(p, spec)
        add_sweep_options(p)
    except argparse.ArgumentError as exc:
        raise UsageError(f"probe {spec.name!r}: a Config field clashes with a shared option ({exc}); expected "
                         f"other field names than the sweep, output and needs options (e.g. not iters or path)") \
            from None
    p.set_defaults(handler=functools.partial(_skips_recorded, spec, functools.partial(run, spec)))
    return p


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
            skip(spec.name, str(exc), {}, settings, json_path=getattr(args, "json", None),
                 results_dir=getattr(args, "results_dir", "results"))
        raise


def _owns_the_record() -> bool:
    from ..world.launch import RANK_VARIABLES, SPAWNED_ENV

    return not os.environ.get(SPAWNED_ENV) and all(os.environ.get(v, "0") == "0" for v in RANK_VARIABLES)


# --------------------------------------------------------------------------- options from a Config


@dataclasses.dataclass(frozen=True)
class Option:
    field: str
    kind: str          # sizes | size | bool | int | float | str | str_list | int_list
    default: Any       # dataclasses.MISSING: a required option
    help: str

    @property
    def flag(self) -> str:
        return "--" + self.field.replace("_", "-")

    @property
    def dest(self) -> str:
        return f"config_{self.field}"   # apart from the shared options' names

    def add_to(self, group: Any) -> None:
        required = self.default is dataclasses.MISSING
        shown = "required" if required else f"default {self.format(self.default)}"
        text = f"{self.help} ({shown})" if self.help else shown
        if self.kind == "bool":
            group.add_argument(self.flag, dest=self.dest, action=argparse.BooleanOptionalAction, default=None,
                               help=text, required=required)
        else:
            group.add_argument(self.flag, dest=self.dest, default=None, help=text, required=required,
                               metavar=self.field.upper())

    def format(self, value: Any) -> str:
        if value is None:
            return "none"
        if self.kind == "sizes":
            return ",".join(format_size(v) for v in value)
        if self.kind == "size":
            return format_size(value)
        if self.kind == "bool":
            return "on" if value else "off"
        if isinstance(value, (list, tuple)):
            return ",".join(str(v) for v in value)
        return str(value)

    def parse(self, text: Any, factor: float = 2.0) -> Any:
        if self.kind == "bool":
            return bool(text)
        if self.kind == "sizes":
            return parse_sizes(text, factor=factor, what=self.flag)
        if self.kind == "size":
            return parse_size(text, what=self.flag)
        if self.kind == "int":
            return _parse_int(text, self.flag)
        if self.kind == "float":
            return parse_number(text, what=self.flag, example="1.5")
        if self.kind in ("str_list", "int_list"):
            items = [item.strip() for item in str(text).split(",") if item.strip()]
            if not items:
                raise UsageError(f"invalid {self.flag} {text!r}: empty; expected a comma list, e.g. {self.flag} a,b")
            return [_parse_int(i, self.flag) for i in items] if self.kind == "int_list" else items
        return str(text)


def _parse_int(text: Any, flag: str) -> int:
    try:
        return int(str(text).strip())
    except ValueError:
        raise UsageError(f"invalid {flag} {text!r}: expected a whole number, e.g. {flag} 4") from None


def _kind(name: str, hint: Any) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):   # Optional[X]: X, default None
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1:
            hint = inner[0]
            origin, args = typing.get_origin(hint), typing.get_args(hint)
    listed = origin in (list, tuple)
    if name == "sizes" or (name.endswith("_bytes") and listed):
        return "sizes"
    if name.endswith("_bytes"):
        return "size"
    if hint is bool:
        return "bool"
    if hint is int:
        return "int"
    if hint is float:
        return "float"
    if listed and args and args[0] is int:
        return "int_list"
    if listed:
        return "str_list"
    return "str"


def config_options(config: type | None) -> list[Option]:
    """One option per init field of the Config dataclass: its type from the annotation, its help
    from the field's metadata {"help": ...}, sizes parsed as sizes (`sizes`, `*_bytes`)."""
    if config is None:
        return []
    if not dataclasses.is_dataclass(config):
        raise UsageError(f"probe config {config!r} is not a dataclass; expected a @dataclass Config")
    hints = typing.get_type_hints(config)
    options = []
    for f in dataclasses.fields(config):
        if not f.init:
            continue
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = dataclasses.MISSING
        options.append(Option(f.name, _kind(f.name, hints.get(f.name, str)), default, str(f.metadata.get("help", ""))))
    return options


def build_config(spec: ProbeSpec, args: argparse.Namespace) -> Any:
    """The Config from the command line: the options given, the dataclass's defaults for the rest."""
    if spec.config is None:
        return {}
    factor = 2.0
    if getattr(args, "factor", None) is not None:
        factor = parse_number(args.factor, what="--factor", example="2", minimum=1.0, allow_minimum=False)
    values = {}
    for opt in config_options(spec.config):
        given = getattr(args, opt.dest, None)
        if given is not None:
            values[opt.field] = opt.parse(given, factor)
    return spec.config(**values)


# --------------------------------------------------------------------------- running one


def run(spec: ProbeSpec, args: argparse.Namespace) -> int:
    config = build_config(spec, args)   # every flag checked before anything is set up
    settings = settings_from_args(args)
    if spec.needs.world:
        return _run_in_world(spec, args, config, settings)
    with needs.prepare(spec, args) as context:
        probe = spec.build(config, context)
        outcome = run_probe(probe, settings, config=config, json_path=args.json, results_dir=args.results_dir,
                            extra_implementation=context.facts)
    _report(spec, args, outcome)
    return 0


def _run_in_world(spec: ProbeSpec, args: argparse.Namespace, config: Any, settings: Any) -> int:
    from ..world import backends
    from ..world.policy import in_world, local_ranks

    if spec.needs.s3:
        raise UsageError(f"probe {spec.name!r} needs a world and S3: the generic command does not hand an "
                         f"embedded server to ranks; give the probe its own CLI module (spec.cli)")
    nproc = parse_positive_int(args.nproc, what="--nproc", example="2") if args.nproc is not None else local_ranks()
    timeout_s = parse_timeout(args.timeout)

    def body(world: Any) -> int:
        with needs.prepare(spec, args) as context:
            context.world = world
            probe = spec.build(config, context)
            outcome = run_probe(probe, settings, config=config, world=world, json_path=args.json,
                                results_dir=args.results_dir, extra_implementation=context.facts)
        if world.rank == 0:
            _report(spec, args, outcome)
        return 0

    return in_world(nproc=nproc, timeout_s=timeout_s, choice=backends.choose("auto"), body=body)


def _report(spec: ProbeSpec, args: argparse.Namespace, outcome: Any) -> None:
    if spec.printer is not None:
        spec.printer(outcome)
    else:
        print_table(spec, outcome.rows)
    write_outputs(args, outcome)
    print(f"# results: {outcome.path}")


def print_table(spec: ProbeSpec, rows: list[dict[str, Any]]) -> None:
    """op, size, time p50 and the spec's metrics that the rows carry."""
    metrics = [m for m in spec.metrics if any(isinstance(r.get(m), (int, float)) for r in rows)]
    table = [(r.get("op", "-"), format_size(r.get("size_bytes", 0)), f"{r['time_us']['p50']:.1f}",
              *("-" if r.get(m) is None else f"{r[m]:.3f}" for m in metrics)) for r in rows]
    print(tabulate(table, headers=["op", "size", "time p50 (us)", *metrics], tablefmt="simple", disable_numparse=True))
