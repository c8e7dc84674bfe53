"""Flags of a command that is not a probe (compose, verify), declared once, in sections.

A section is a dataclass whose fields use core/options.option(), as a probe's Config does; it
is one --help group (its TITLE and DESCRIPTION class attributes). A command gathers its sections
in one dataclass (torchtitan's JobConfig of Training, Model, Checkpoint, ...). The command
line, the typed values the library takes and the record's resolved config then come from that
one declaration, every number parsed by core/units.py when argv is read, before any work:

    @dataclass
    class Training:
        TITLE: ClassVar[str] = "training"
        seq_len: int = option(4096, help="tokens per sequence", parse=positive_int)

    @dataclass
    class Options:
        training: Training = field(default_factory=Training)

    add_sections(parser, Options)          # the argparse groups, each help with its default
    opts = parse_sections(Options, args)   # Options(training=Training(seq_len=...)), or UsageError
    record["config"]["options"] = resolved(opts)

A section (or the gathering dataclass) may define `check(self)`, called once it is parsed:
misuse that takes two flags to see (--params without --layers) is refused there.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from typing import Any

from .options import add_flag, flags, recorded


def sections(options: type) -> list[tuple[str, type]]:
    """(field name, section class) of a dataclass of sections, in order."""
    hints = typing.get_type_hints(options)
    return [(f.name, hints[f.name]) for f in dataclasses.fields(options) if dataclasses.is_dataclass(hints[f.name])]


def add_section(parser: argparse.ArgumentParser, section: type) -> Any:
    """The section's flags as one argparse group, titled by its TITLE (else its name)."""
    group = parser.add_argument_group(
        getattr(section, "TITLE", section.__name__.lower()), getattr(section, "DESCRIPTION", None)
    )
    for flag in flags(section):
        add_flag(group, flag)
    return group


def add_sections(parser: argparse.ArgumentParser, options: type) -> None:
    for _, section in sections(options):
        add_section(parser, section)


def parse_section(section: type, args: argparse.Namespace) -> Any:
    """The typed section from parsed argv: each flag given parsed once (core/units.py), the
    field's default for the rest, then the section's own check."""
    values = {}
    for flag in flags(section):
        given = getattr(args, flag.dest, None)
        if given is None or (flag.opt.repeat and not given):
            continue
        values[flag.name] = flag.value(given)
    out = section(**values)
    check = getattr(out, "check", None)
    if callable(check):
        check()
    return out


def parse_sections(options: type, args: argparse.Namespace) -> Any:
    out = options(**{name: parse_section(section, args) for name, section in sections(options)})
    check = getattr(out, "check", None)
    if callable(check):
        check()
    return out


def resolved(options: Any) -> dict[str, Any]:
    """The values a record keeps, per section: what --help states as defaults, or what was given
    (run-only flags, record=False, left out)."""
    return {name: recorded(getattr(options, name)) for name, _ in sections(type(options))}
