"""The one reader of JSON files a user hands us: records (plot, compare, report, compose --nccl,
--compute, --storage, --calibration), configs (--model-config, --accept as JSON, --link-result).

A user's file can be anything: random bytes, UTF-16 from an editor, a directory, a symlink
loop, a FIFO, a gigabyte log, `[` nested 100,000 deep. Each is refused as a UsageError that
says what the file is not (exit 2, one line), never a UnicodeDecodeError, RecursionError or
IsADirectoryError from deep inside a command. Bounded: at most MAX_JSON_BYTES read (a FIFO or
/dev/zero cannot stall or fill memory) and at most MAX_JSON_DEPTH levels of nesting (records
nest about 5 deep; Python's decoder would recurse until the interpreter's limit).

Numbers are checked here, once for every reader: NaN, Infinity, a literal that overflows a float
(1e400) and any number whose size is absurd (beyond MAX_JSON_MAGNITUDE, or a non-zero one below
MIN_JSON_MAGNITUDE) are refused, naming the field (`rows[3].time_us.p50`). Python's decoder
turns 1e400 into inf and fails on a 5,000-digit integer with a ValueError; either, or a
bandwidth of 1e300 whose time underflows to 0, reached a plot, a compare or the composer and
ended there as an internal error (OverflowError, ZeroDivisionError). No measurement or model
input comes near the bounds: a byte count of a petabyte is 1e15, a training run's FLOPs 1e25.
"""

from __future__ import annotations

import errno
import json
import math
import os
import stat
from typing import Any

from .errors import UsageError

MAX_JSON_BYTES = 256 << 20   # a record of a million rows is ~200 MiB; beyond that a wrong file
MAX_JSON_DEPTH = 64
MAX_JSON_MAGNITUDE = 1e30
MIN_JSON_MAGNITUDE = 1e-30


def load_json(path: str | os.PathLike, *, what: str, expected: str, finite: bool = True) -> Any:
    """The parsed contents of `path`; UsageError "{what} {path!r} is ...; expected {expected}".

    what: how the message names the file ("results file", "--model-config").
    expected: what it should be ("a microbench record, e.g. results/suite-*/nccl.json").
    Every number must be finite and of a sane size (module docstring), whatever `finite` says:
    the flag stays for callers written when records could hold NaN.
    """
    refuse = _refuser(path, what, expected)
    body = read_text(path, what=what, expected=expected)
    absurd: list[str] = []
    try:
        value = json.loads(body, parse_constant=_checked_constant(absurd), parse_float=_checked_float(absurd),
                           parse_int=_checked_int(absurd))
    except RecursionError:
        raise refuse(f"nests deeper than {MAX_JSON_DEPTH} levels") from None
    except json.JSONDecodeError as exc:
        raise refuse(f"is not JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
    if _depth_over(value, MAX_JSON_DEPTH):
        raise refuse(f"nests deeper than {MAX_JSON_DEPTH} levels")
    if absurd:
        field, text = _first_absurd(value)
        raise refuse(f"holds {text} at {field}: every number in it must be finite, and 0 or between "
                     f"1e{round(math.log10(MIN_JSON_MAGNITUDE))} and 1e{round(math.log10(MAX_JSON_MAGNITUDE))} in size")
    return value


class _Absurd:
    """A number the file holds that no reader may compute with, kept as written to be named."""

    def __init__(self, text: str) -> None:
        digits = sum(ch.isdigit() for ch in text)
        self.text = text if len(text) <= 40 else f"{text[:12]}... (a number of {digits} digits)"


def _checked_constant(absurd: list[str]):
    def parse(name: str) -> _Absurd:
        absurd.append(name)
        return _Absurd(name)
    return parse


def _sane(number: float) -> bool:
    size = abs(number)
    return math.isfinite(number) and (size == 0 or MIN_JSON_MAGNITUDE <= size <= MAX_JSON_MAGNITUDE)


def _checked_float(absurd: list[str]):
    def parse(text: str) -> float | _Absurd:
        number = float(text)
        if _sane(number):
            return number
        absurd.append(text)
        return _Absurd(text)
    return parse


def _checked_int(absurd: list[str]):
    # Looked at as text first: int() of a 5,000-digit literal raises ValueError (Python's limit
    # on integer string conversion), and a number that long is refused anyway.
    def parse(text: str) -> int | _Absurd:
        if len(text.lstrip("-")) <= 31:
            number = int(text)
            if abs(number) <= MAX_JSON_MAGNITUDE:
                return number
        absurd.append(text)
        return _Absurd(text)
    return parse


def _first_absurd(value: Any) -> tuple[str, str]:
    """(where, the number as written) of the first refused number, e.g. ('rows[3].time_us.p50', '1e400')."""
    todo: list[tuple[Any, str]] = [(value, "")]
    while todo:   # depth first, children pushed in reverse: the first in the file's order
        item, where = todo.pop()
        if isinstance(item, _Absurd):
            return where or "the top level", item.text
        if isinstance(item, dict):
            todo.extend(reversed([(child, f"{where}.{key}" if where else str(key)) for key, child in item.items()]))
        elif isinstance(item, list):
            todo.extend(reversed([(child, f"{where}[{index}]") for index, child in enumerate(item)]))
    return "the top level", "?"


def read_text(path: str | os.PathLike, *, what: str, expected: str) -> str:
    """The UTF-8 text of a regular file of at most MAX_JSON_BYTES (JSON, or TOML thresholds),
    or UsageError saying what `path` is instead."""
    refuse = _refuser(path, what, expected)
    if not str(path).strip():
        raise UsageError(f"{what} {str(path)!r} is empty; expected a path to {expected}")
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise refuse("does not exist") from None
    except OSError as exc:
        raise refuse(_os_why(exc)) from None
    if stat.S_ISDIR(info.st_mode):
        raise refuse("is a directory")
    if not stat.S_ISREG(info.st_mode):
        raise refuse("is not a regular file (a device, FIFO or socket)")
    if info.st_size > MAX_JSON_BYTES:
        raise refuse(f"is {info.st_size / (1 << 20):.0f} MiB, more than the {MAX_JSON_BYTES >> 20} MiB "
                     f"an input file may be")
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_JSON_BYTES + 1)
    except OSError as exc:
        raise refuse(_os_why(exc)) from None
    if len(data) > MAX_JSON_BYTES:   # grew while we read it
        raise refuse(f"is more than the {MAX_JSON_BYTES >> 20} MiB an input file may be")
    return _decode(data, refuse)


def _refuser(path: str | os.PathLike, what: str, expected: str):
    def refuse(why: str) -> UsageError:
        return UsageError(f"{what} {str(path)!r} {why}; expected {expected}")
    return refuse


def _os_why(exc: OSError) -> str:
    if exc.errno == errno.ELOOP:
        return "is a symlink loop (too many levels of symbolic links)"
    if exc.errno == errno.EISDIR:
        return "is a directory"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return "cannot be read by this user (permission denied)"
    if exc.errno == errno.ENOTDIR:
        return "does not exist (a part of the path is a file, not a directory)"
    if exc.errno == errno.ENAMETOOLONG:
        return "is a path too long for the filesystem"
    return f"cannot be read ({exc.strerror or exc})"


def _decode(data: bytes, refuse) -> str:
    # json.detect_encoding reads the BOM or the pattern of zero bytes JSON's first characters
    # leave in UTF-16/32; anything but UTF-8 is named rather than decoded as a guess.
    encoding = json.detect_encoding(data) if data else "utf-8"
    if encoding not in ("utf-8", "utf-8-sig"):
        raise refuse(f"is {encoding.upper().replace('-LE', '').replace('-BE', '')} text, not UTF-8 "
                     f"(save it as UTF-8)")
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as exc:
        raise refuse(f"is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}): "
                     f"a binary file or another encoding") from None


def _depth_over(value: Any, limit: int) -> bool:
    """Nesting deeper than `limit`, walked without recursion."""
    todo = [(value, 1)]
    while todo:
        item, depth = todo.pop()
        if isinstance(item, (dict, list)):
            if depth > limit:
                return True
            children = item.values() if isinstance(item, dict) else item
            todo.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False


def finite_number(value: Any) -> bool:
    """A JSON number a reader may compute with: int or float, not bool, not NaN or infinite."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def json_object(value: Any, default: dict[str, Any] | None = None) -> dict[str, Any]:
    """`value` when it is a JSON object, else `default` (a new empty one when none given): a
    record's optional sections, read without a type check at every key."""
    if isinstance(value, dict):
        return value
    return {} if default is None else default
