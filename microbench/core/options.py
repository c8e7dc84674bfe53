"""A probe's option table: its Config dataclass, one field per flag (fio declares an engine's
options once, next to the engine; torchtitan makes its CLI from config dataclasses). Commands
that are not probes (compose, verify) declare theirs the same way, in sections (core/sections.py).

Each field that is a flag carries `option(...)` metadata: help once, how the text is parsed
(one of the parsers in core/units.py, so every number is checked in one place), and how --help
shows the default. The command line, the record's resolved config and the suite then read the
same default. A field without `option` metadata is not a flag: the probe's validate hook fills it
(shapes resolved from --model, the backend chosen from --backend and the machine).

    @dataclass
    class Config:
        sizes: list[int] = option([1 << 20], help="1M-4G (range), 64M, or 1M,8M,64M", parse=sweep)
        streams: int = option(1, help="parallel TCP connections", parse=positive_int)
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from dataclasses import MISSING, dataclass
from typing import Any, Callable

from . import units
from .errors import UsageError

Parser = Callable[[Any, str], Any]   # (text, flag) -> value; raises UsageError quoting both


@dataclass(frozen=True)
class Opt:
    help: str
    parse: Parser | None = None      # None: the field's type decides (int, float, str, list[str])
    flag: str | None = None          # default --field-name
    metavar: str | None = None
    shown: str | None = None         # the default as --help states it, where the value alone misleads
    switch: bool = False             # a flag that takes no value and sets `switch_value` (--keep); else --x/--no-x
    switch_value: Any = True
    negative: str | None = None      # one more flag that sets the field False (--buffered)
    choices: tuple[str, ...] | None = None
    record: bool = True              # False: a flag for this run only, not part of the resolved config
    group: str = "probe"             # the --help section
    repeat: bool = False  # given again, it adds an item (--tier a=1 --tier b=2): a list, each item parsed
    bare: str | None = None  # the value the flag alone means (--activation-checkpointing = full); else it needs one

    def flag_for(self, name: str) -> str:
        return self.flag or "--" + name.replace("_", "-")


def option(default: Any = MISSING, *, default_factory: Any = MISSING, help: str, **opt: Any) -> Any:
    """A Config field that is a flag. A list default is copied per instance."""
    meta = {"option": Opt(help=help, **opt)}
    if isinstance(default, (list, dict, set)):
        value = default
        return dataclasses.field(default_factory=lambda: type(value)(value), metadata=meta)
    return dataclasses.field(default=default, default_factory=default_factory, metadata=meta)


@dataclass(frozen=True)
class Flag:
    """One field of a Config as the command line sees it."""

    name: str
    opt: Opt
    default: Any        # MISSING: required
    hint: Any

    @property
    def field(self) -> str:
        return self.name

    @property
    def flag(self) -> str:
        return self.opt.flag_for(self.name)

    @property
    def dest(self) -> str:
        # The field's own name: a field that shares a shared option's name also shares its flag,
        # which argparse refuses (the command then names the clash).
        return self.name

    @property
    def is_bool(self) -> bool:
        return _inner(self.hint) is bool

    @property
    def kind(self) -> str:
        """sizes | size | bool | int | float | int_list | str_list | str: how a value is shown, and
        parsed when the field names no parser."""
        return _kind(self.name, self.hint)

    @property
    def help(self) -> str:
        return self.opt.help

    def shown(self) -> str:
        if self.opt.shown is not None:
            return self.opt.shown
        if self.kind == "sizes" and isinstance(self.default, (list, tuple)):
            return ",".join(units.format_size_exact(v) for v in self.default)
        if self.kind == "size" and isinstance(self.default, int):
            return units.format_size_exact(self.default)
        return format_value(self.default)

    def value(self, given: Any, factor: float = 2.0) -> Any:
        """The field's value from what argparse collected for the flag (not None: it was given)."""
        if self.opt.switch:
            return given
        if self.opt.repeat:
            return [self.parse(item, factor) for item in given]
        return self.parse(given, factor)

    def parse(self, text: Any, factor: float = 2.0) -> Any:
        if self.is_bool:
            return bool(text)
        parse = self.opt.parse or _PARSERS.get("str" if self.opt.repeat else self.kind)
        if self.opt.choices is not None and self.opt.parse is None:
            parse = choice(self.opt.choices)
        if isinstance(parse, Sizes):   # the one parser that takes the command's --factor
            return parse(text, self.flag, factor)
        return parse(text, self.flag) if parse is not None else str(text)


def _inner(hint: Any) -> Any:
    """X for Optional[X]."""
    args = typing.get_args(hint)
    if type(None) in args:
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1:
            return inner[0]
    return hint


def _kind(name: str, hint: Any) -> str:
    hint = _inner(hint)
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


def format_value(value: Any) -> str:
    if value is None or value is MISSING:
        return "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return str(value)


def flags(config: type | None) -> list[Flag]:
    """The flags of a Config dataclass, in field order. Where any field carries `option`, those
    fields are the flags and the others are filled by the probe. A plain dataclass (an
    out-of-tree probe's) makes every init field a flag, typed by its annotation and name (`sizes`
    and `*_bytes` are sizes) with `metadata={"help": ...}`."""
    if config is None:
        return []
    if not dataclasses.is_dataclass(config):
        raise UsageError(f"probe config {config!r} is not a dataclass; expected a @dataclass Config")
    hints = typing.get_type_hints(config)
    fields = [f for f in dataclasses.fields(config) if f.init]
    explicit = any("option" in f.metadata for f in fields)
    out = []
    for f in fields:
        opt = f.metadata.get("option")
        if opt is None:
            if explicit:
                continue
            opt = Opt(help=str(f.metadata.get("help", "")))
        if f.default is not MISSING:
            default = f.default
        elif f.default_factory is not MISSING:
            default = f.default_factory()
        else:
            default = MISSING
        out.append(Flag(f.name, opt, default, hints.get(f.name, str)))
    return out


def recorded(config: Any) -> dict[str, Any]:
    """The resolved config as a record holds it: every field but the run-only flags."""
    skip = {f.name for f in dataclasses.fields(config)
            if not getattr(f.metadata.get("option"), "record", True) or f.metadata.get("record") is False}
    return {k: v for k, v in dataclasses.asdict(config).items() if k not in skip}


def add_flag(group: Any, flag: Flag) -> None:
    """One flag on an argparse parser or group, its help stating the default. argparse collects
    the text only (default None: not given); Flag.value parses it into the field's type."""
    opt = flag.opt
    required = flag.default is dataclasses.MISSING
    # A default of None that the field does not describe is "not given": nothing to show. A
    # switch states its default only when the field says how (shown="off").
    shown = "" if (required or (flag.default is None and opt.shown is None)) else flag.shown()
    if opt.switch and opt.shown is None:
        shown = ""
    text = opt.help if shown == "" else f"{opt.help} (default {shown})"
    text = text.replace("%", "%%")   # argparse formats help with %
    if opt.switch:
        group.add_argument(flag.flag, dest=flag.dest, action="store_const", const=opt.switch_value, default=None,
                           help=text)
    elif flag.is_bool:
        group.add_argument(flag.flag, dest=flag.dest, action=argparse.BooleanOptionalAction, default=None, help=text)
    elif opt.repeat:
        # An empty list, not None, when never given: nothing to parse, and --help's reader of
        # argparse's own default sees what it always saw for a repeatable flag.
        group.add_argument(flag.flag, dest=flag.dest, action="append", default=[], help=text,
                           metavar=opt.metavar or flag.name.upper())
    else:
        bare = {"nargs": "?", "const": opt.bare} if opt.bare is not None else {}
        group.add_argument(flag.flag, dest=flag.dest, default=None, help=text, required=required,
                           metavar=opt.metavar or flag.name.upper(), choices=opt.choices, **bare)
    if opt.negative:
        group.add_argument(opt.negative, dest=flag.dest, action="store_const", const=False,
                           help=f"same as --no-{flag.flag[2:]}")


# ----------------------------------------------------------------------------- parsers
# Each is (text, flag) -> value and quotes the flag and the text when it refuses. Their names
# are not field names (a Config's `sizes` field would hide a parser called `sizes` from the
# fields declared after it in the class body).

def nbytes(text: Any, flag: str) -> int:
    return units.parse_size(text, what=flag)


def positive_int(text: Any, flag: str) -> int:
    return units.parse_positive_int(text, what=flag, example="2")


def nonneg_int(text: Any, flag: str) -> int:
    return units.parse_int(text, what=flag, minimum=0)


def positive(text: Any, flag: str) -> float:
    return units.parse_positive(text, what=flag, example="60")


def timeout(text: Any, flag: str) -> float:
    return units.parse_timeout(text, what=flag, example="60")   # more than 0, at most a day


def text(value: Any, flag: str) -> str:
    return str(value)


def names(text: Any, flag: str) -> list[str]:
    items = [item.strip() for item in str(text).split(",") if item.strip()]
    if not items:
        raise UsageError(f"invalid {flag} {text!r}: empty; expected a comma list, e.g. {flag} a,b")
    return items


def one_of(allowed: tuple[str, ...] | list[str]) -> Parser:
    """A comma list whose every item is one of `allowed` (`all` for every one)."""
    def parse(text: Any, flag: str) -> list[str]:
        return units.parse_list(text, tuple(allowed), what=flag)
    return parse


def choice(allowed: tuple[str, ...] | list[str]) -> Parser:
    def parse(text: Any, flag: str) -> str:
        value = str(text).strip()
        if value not in allowed:
            raise UsageError(f"invalid {flag} {text!r}: expected one of {', '.join(allowed)}, "
                                   f"e.g. {flag} {allowed[0]}")
        return value
    return parse


def size_list(text: Any, flag: str) -> list[int]:
    """Comma-separated sizes, sorted and without repeats (block sizes: --bs 1M,16M)."""
    out = [units.parse_size(part, what=flag, typed=str(text)) for part in str(text).split(",") if part.strip()]
    if not out:
        raise UsageError(f"invalid {flag} {text!r}: empty; expected sizes, e.g. {flag} 1M,16M")
    return sorted(set(out))


class Sizes:
    """A sweep's sizes: a list, or a range stepped by the command's --factor (`1M-4G`). The
    factor is read first, so the range is parsed with it."""

    def __call__(self, text: Any, flag: str, factor: float = 2.0) -> list[int]:
        return units.parse_sizes(text, factor=factor, what=flag)


sweep = Sizes()


def size_range(text: Any, flag: str) -> list[int]:
    """Sizes, a list or a range stepped by 2, for a probe without a --factor flag."""
    return units.parse_sizes(text, what=flag)


def _int(text: Any, flag: str) -> int:
    return units.parse_int(text, what=flag)


def _float(text: Any, flag: str) -> float:
    return units.parse_number(text, what=flag, example="1.5")


def _ints(text: Any, flag: str) -> list[int]:
    return [units.parse_int(item, what=flag) for item in names(text, flag)]


_PARSERS: dict[str, Parser] = {"sizes": sweep, "size": nbytes, "int": _int, "float": _float, "int_list": _ints,
                               "str_list": names, "str": text}
