"""Units: one home for sizes, numbers, rates, durations, dtype sizes and bus factors.

Parsing: binary units for sizes (1K = 1024); GB/s means 1e9 bytes/s. Sizes take the forms
nccl-tests users expect: a single size (`64M`), a geometric range (`1M-4G`, stepped by
--factor), or a list (`1M,8M,64M`); plain integers are bytes. Every number from the command
line goes through `parse_number`, which refuses NaN and infinities.

Dtype sizes and nccl-tests' bus factors live here because both the probes (which measure) and
the composer (which predicts from what they measured) need the same figures; two copies would
drift apart silently and the prediction would stop matching the measurement.
"""

from __future__ import annotations

import math
import re

from .errors import UsageError

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE_RE = re.compile(r"^\s*(\d+)\s*([KMGT]?)(?:I?B)?\s*$", re.IGNORECASE)
_EXAMPLE = "e.g. 1M-4G, 64M or 1M,8M,64M"


def parse_size(text: str, *, what: str = "size", allow_zero: bool = False, typed: str | None = None) -> int:
    """Parse one size like `4K`, `16M`, `2G`, `1048576` into bytes. `typed`: the whole value as the
    user typed it when `text` is one member of it (a list, a range): the message quotes both."""
    raw = str(text).strip()
    quoted = repr(raw) if typed is None or str(typed).strip() == raw else f"{str(typed)!r}: {raw!r}"
    match = _SIZE_RE.match(raw)
    if not match:
        raise UsageError(
            f"invalid {what} {quoted}: expected a whole number of bytes with an optional "
            f"binary suffix K, M, G or T (e.g. 4K, 16M, 2G)"
        )
    value = int(match.group(1)) * _UNITS[match.group(2).upper()]
    if value == 0 and not allow_zero:
        raise UsageError(f"invalid {what} {quoted}: must be greater than zero (e.g. 1M)")
    return value


def parse_sizes(spec: str, *, factor: float = 2.0, what: str = "--sizes") -> list[int]:
    """Expand a size spec into the ascending list of sizes to sweep."""
    text = str(spec).strip()
    if not text:
        raise UsageError(f"invalid {what} {spec!r}: empty; expected {_EXAMPLE}")
    if text.startswith("-"):
        raise UsageError(f"invalid {what} {spec!r}: sizes cannot be negative; expected {_EXAMPLE}")
    if factor <= 1:
        raise UsageError(f"invalid --factor {factor!r}: must be greater than 1 (e.g. 2)")
    if "," in text:
        sizes = [_parse_member(part, spec, what) for part in text.split(",")]
        return sorted(set(sizes))
    if "-" in text:
        lo_text, _, hi_text = text.partition("-")
        if hi_text.strip().startswith("-") or not hi_text.strip() or not lo_text.strip():
            raise UsageError(f"invalid {what} {spec!r}: expected MIN-MAX, e.g. 1M-4G")
        lo = _parse_member(lo_text, spec, what)
        hi = _parse_member(hi_text, spec, what)
        if lo > hi:
            raise UsageError(
                f"invalid {what} {spec!r}: the range starts above its end; expected MIN-MAX "
                f"with MIN <= MAX, e.g. {format_size_exact(hi)}-{format_size_exact(lo)}"
            )
        sizes, size = [], float(lo)
        while size <= hi * (1 + 1e-12):
            sizes.append(int(round(size)))
            size *= factor
        if sizes[-1] != hi:
            # The end of the range is what users ask about most (e.g. 4G); always include it.
            sizes.append(hi)
        return sorted(set(sizes))
    return [parse_size(text, what=what)]


def _parse_member(part: str, spec: str, what: str) -> int:
    try:
        return parse_size(part)
    except UsageError as exc:
        raise UsageError(f"invalid {what} {spec!r}: {part.strip()!r} is not a size; "
                         f"expected {_EXAMPLE}") from exc


_SIZE_STEPS = (("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10))


def format_size(size_bytes: int | float) -> str:
    """A size as people read it, in the largest binary unit it reaches: 1048576 -> '1M', 1536 ->
    '1.5K', 32768000 -> '31.2M' (never '32000K'); whole multiples without a decimal. For text a
    user types back (a suggested flag), use format_size_exact."""
    size = int(size_bytes)
    for index, (suffix, unit) in enumerate(_SIZE_STEPS):
        if size >= unit:
            if size % unit == 0:
                return f"{size // unit}{suffix}"
            shown = round(size / unit, 1)
            if shown >= 1024 and index > 0:   # 1023.97M would print as 1024.0M: one unit up reads
                suffix = _SIZE_STEPS[index - 1][0]
                shown = round(size / _SIZE_STEPS[index - 1][1], 1)
            return f"{shown:.1f}{suffix}"
    return f"{size}B"


def format_size_exact(size_bytes: int | float) -> str:
    """The size as a flag takes it back, exactly: the largest unit that divides it ('32000K',
    '1536'), for suggestions such as 'e.g. --bs 1536K'."""
    size = int(size_bytes)
    for suffix, unit in _SIZE_STEPS:
        if size >= unit and size % unit == 0:
            return f"{size // unit}{suffix}"
    return str(size)


def format_number(value: float | int, digits: int = 3) -> str:
    """`value` to `digits` significant digits in plain decimals, as %g would but never in
    scientific notation (25600, not 2.56e+04; 0.000123, not 1.23e-04): tables and
    progress lines are read by people and grepped by scripts, and neither reads exponents."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if not math.isfinite(value):
        return str(value)
    if value == 0:
        return "0"
    magnitude = math.floor(math.log10(abs(value)))
    if magnitude >= digits - 1:
        return f"{value:.0f}"
    decimals = min(digits - 1 - magnitude, 15)
    text = f"{value:.{decimals}f}"
    text = text.rstrip("0").rstrip(".") if "." in text else text
    return "0" if text in ("-0", "") else text


def format_bytes_human(size_bytes: int | float) -> str:
    """'1.5 GiB' style, for messages about memory and disk space."""
    value = float(size_bytes)
    for suffix in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or suffix == "TiB":
            return f"{value:.0f} {suffix}" if suffix == "B" else f"{value:.1f} {suffix}"
        value /= 1024
    return f"{value:.1f} TiB"


# A run plans on at most this share of the free memory: the rest stays for the OS and for what
# the estimates leave out (the interpreters, torch's own allocations).
MEMORY_SHARE = 0.9


def memory_shortfall(need_bytes: int | float, free_bytes: int | float, what: str) -> str | None:
    """None when need_bytes fits in the share of free_bytes a run may take; otherwise the clause
    that says so with all three figures, so that 20 GiB against 22 GiB free reads as the rule
    it breaks rather than as a contradiction."""
    allowed = free_bytes * MEMORY_SHARE
    if need_bytes <= allowed:
        return None
    return (f"needs about {format_bytes_human(need_bytes)} of {what}, more than the {format_bytes_human(allowed)} "
            f"a run may take ({MEMORY_SHARE:.0%} of the {format_bytes_human(free_bytes)} free)")


def parse_int(text: str | int, *, what: str, minimum: int | None = None, example: str = "4") -> int:
    """A whole number, at least `minimum` when given."""
    try:
        value = int(str(text).strip())
    except ValueError:
        more = f" >= {minimum}" if minimum is not None else ""
        raise UsageError(f"invalid {what} {text!r}: expected a whole number{more}, e.g. {what} {example}") from None
    if minimum is not None and value < minimum:
        raise UsageError(f"invalid {what} {text!r}: must be {minimum} or more, e.g. {what} {example}")
    return value


def parse_positive_int(text: str | int, *, what: str, example: str = "4", maximum: int | None = None) -> int:
    """A whole number from 1 to `maximum` (a bound past which the value is a typo, not a plan)."""
    try:
        value = int(str(text).strip())
    except ValueError:
        raise UsageError(f"invalid {what} {text!r}: expected a positive whole number, e.g. {example}") from None
    if value <= 0:
        raise UsageError(f"invalid {what} {text!r}: must be at least 1, e.g. {example}")
    if maximum is not None and value > maximum:
        raise UsageError(f"invalid {what} {text!r}: must be at most {maximum:,}, e.g. {example}")
    return value


def parse_list(text: str, allowed: list[str] | tuple[str, ...], *, what: str) -> list[str]:
    """Comma list whose members must come from `allowed`; order kept, duplicates dropped."""
    items = [item.strip().lower().replace("-", "_") for item in str(text).split(",") if item.strip()]
    if not items:
        raise UsageError(f"invalid {what} {text!r}: empty; expected some of {', '.join(allowed)}")
    for item in items:
        if item not in allowed:
            raise UsageError(
                f"invalid {what} {item!r}: expected one or more of {', '.join(allowed)} "
                f"(e.g. {what} {','.join(allowed[:2])})"
            )
    return list(dict.fromkeys(items))


# --------------------------------------------------------------------------- numbers and rates
# Every numeric option goes through parse_number: float() alone accepts 'nan', 'inf' and '1e999',
# which then poison a sweep or a prediction far from the flag that caused them.

def parse_number(text: str | float | int, *, what: str, example: str, minimum: float | None = None,
                 maximum: float | None = None, allow_minimum: bool = True, allow_maximum: bool = True,
                 typed: str | None = None) -> float:
    """A finite number within [minimum, maximum] (bounds exclusive when allow_* is False).
    `typed`: the value as the user typed it when `text` is the number cut out of it ('-1' of
    '-1GB/s'): messages quote what was typed, never the part."""
    raw = str(text).strip()
    shown = text if typed is None else typed
    try:
        value = float(raw)
    except ValueError:
        raise UsageError(f"invalid {what} {shown!r}: expected a number, e.g. {what} {example}") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise UsageError(f"invalid {what} {shown!r}: expected a finite number, e.g. {what} {example}")
    if minimum is not None and (value < minimum or (value == minimum and not allow_minimum)):
        rel = "at least" if allow_minimum else "more than"
        raise UsageError(f"invalid {what} {shown!r}: must be {rel} {minimum:g}, e.g. {what} {example}")
    if maximum is not None and (value > maximum or (value == maximum and not allow_maximum)):
        rel = "at most" if allow_maximum else "less than"
        raise UsageError(f"invalid {what} {shown!r}: must be {rel} {maximum:g}, e.g. {what} {example}")
    return value


def parse_positive(text: str | float | int, *, what: str, example: str, maximum: float | None = None,
                   typed: str | None = None) -> float:
    return parse_number(text, what=what, example=example, minimum=0.0, allow_minimum=False, maximum=maximum,
                        typed=typed)


# A timeout is how long a silent peer, endpoint or rank is waited for. Above a day it is a typo or
# "never" (1e300), and it would reach datetime.timedelta, threading and socket calls that
# overflow ("timestamp out of range", OverflowError) far from the flag: refused here instead.
MAX_TIMEOUT_S = 86400.0


def parse_timeout(text: str | float | int, *, what: str = "--timeout", example: str = "60") -> float:
    """Seconds, more than 0 and at most MAX_TIMEOUT_S (one day): the one grammar of every
    command's --timeout. A bare number is seconds (`60`); a duration unit may be given (`90s`,
    `500ms`, `2min`, `1h`), as for --write-back."""
    raw = str(text).strip()
    match = _DURATION_RE.match(raw)
    number, unit = (match.group(1), _DURATION_UNITS[match.group(2).lower()]) \
        if match and match.group(2).lower() in _DURATION_UNITS else (raw, 1.0)
    try:
        seconds = float(number) * unit
    except ValueError:
        raise UsageError(f"invalid {what} {text!r}: expected seconds, or a duration with a unit (ms, s, min, h), "
                         f"e.g. {what} {example}") from None
    if seconds != seconds or seconds in (float("inf"), float("-inf")):
        raise UsageError(f"invalid {what} {text!r}: expected a finite number, e.g. {what} {example}")
    if seconds <= 0:
        raise UsageError(f"invalid {what} {text!r}: must be more than 0, e.g. {what} {example}")
    if seconds > MAX_TIMEOUT_S:
        raise UsageError(f"invalid {what} {text!r}: must be at most {MAX_TIMEOUT_S:g} s (one day), "
                         f"e.g. {what} {example}")
    return seconds


# Bandwidth units: bytes are decimal (GB/s = 1e9 B/s, as every table prints), bits too (1 Gbit = 1e9 bit).
_RATE_UNITS = {
    "b/s": 1.0, "kb/s": 1e3, "mb/s": 1e6, "gb/s": 1e9, "tb/s": 1e12,
    "bit": 0.125, "kbit": 125.0, "mbit": 1.25e5, "gbit": 1.25e8, "tbit": 1.25e11,
    "bps": 0.125, "kbps": 125.0, "mbps": 1.25e5, "gbps": 1.25e8, "tbps": 1.25e11,
}
_RATE_RE = re.compile(r"^\s*([0-9.eE+-]+)\s*([a-zA-Z/]+)\s*$")
_RATE_EXAMPLE = "1.6GB/s, 400Gbit or 100mbit"


def parse_bandwidth_bytes_per_s(text: str, *, what: str) -> float:
    """'1.6GB/s' (bytes, decimal), '400Gbit' or '100gbps' (bits) -> bytes per second.

    A bare number is refused: GB/s and Gbit/s differ by 8x, and guessing is how capacity plans
    go wrong."""
    raw = str(text).strip()
    match = _RATE_RE.match(raw)
    if not match:
        raise UsageError(f"invalid {what} {text!r}: expected a number with a unit, e.g. {_RATE_EXAMPLE}")
    number, unit = match.groups()
    unit_key = unit.lower().replace("/sec", "/s").replace("bit/s", "bit").replace("ps/s", "ps")
    if unit_key not in _RATE_UNITS:
        raise UsageError(f"invalid {what} {text!r}: unknown unit {unit!r}; expected GB/s, MB/s, Gbit, "
                         f"Mbit (e.g. {_RATE_EXAMPLE})")
    value = parse_positive(number, what=what, example="1.6GB/s", typed=text)
    return value * _RATE_UNITS[unit_key]


# A link rate as tc takes it (the lab's --link, --host-link, --pair-link): bits per second, decimal.
_LINK_RATE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(bit|kbit|mbit|gbit|tbit)\s*$", re.IGNORECASE)
_LINK_RATE_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12}
_LINK_RATE_EXAMPLE = "e.g. 1gbit, 100mbit, 10gbit or unlimited"


def parse_link_rate(text: str) -> int | None:
    """Bits per second from tc-style text; None for `unlimited` (no shaping)."""
    raw = str(text).strip().lower()
    if raw in ("unlimited", "none", "0"):
        return None
    match = _LINK_RATE_RE.match(raw)
    if not match:
        raise UsageError(f"invalid --link rate {text!r}: expected a rate in bit/kbit/mbit/gbit, {_LINK_RATE_EXAMPLE}")
    bps = int(float(match.group(1)) * _LINK_RATE_UNITS[match.group(2).lower()])
    if bps < 8000:
        raise UsageError(
            f"invalid --link rate {text!r}: at least 8kbit is needed to move packets, {_LINK_RATE_EXAMPLE}"
        )
    return bps


def format_link_rate(bps: int | None) -> str:
    if bps is None:
        return "unlimited"
    for unit, scale in (("tbit", 10**12), ("gbit", 10**9), ("mbit", 10**6), ("kbit", 10**3)):
        if bps >= scale:
            value = bps / scale
            return f"{value:g}{unit}"
    return f"{bps}bit"


_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0, "h": 3600.0}
_DURATION_RE = re.compile(r"^\s*([0-9.eE+-]+)\s*([a-z]+)\s*$", re.IGNORECASE)


def parse_duration_s(text: str, *, what: str, example: str = "30us", allow_zero: bool = True) -> float:
    """'30us', '1.5ms', '2s', '30min' -> seconds. A unit is required."""
    raw = str(text).strip()
    match = _DURATION_RE.match(raw)
    if not match or match.group(2).lower() not in _DURATION_UNITS:
        raise UsageError(f"invalid {what} {text!r}: expected a duration with a unit (ns, us, ms, s, min, h), "
                         f"e.g. {example}")
    value = parse_number(match.group(1), what=what, example=example, minimum=0.0, allow_minimum=allow_zero,
                         typed=text)
    return value * _DURATION_UNITS[match.group(2).lower()]


# --------------------------------------------------------------------------- dtypes
# Bytes per element of the dtypes collectives, checkpoints, compute and the composer move.
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
DTYPES = tuple(DTYPE_BYTES)
NCCL_TESTS_DTYPE = {"float32": "float", "bfloat16": "bfloat16", "float16": "half"}  # its tables' spelling


def element_size(dtype: str) -> int:
    return DTYPE_BYTES[dtype]


# --------------------------------------------------------------------------- bus factors
# nccl-tests' busbw = algbw * factor(n) (its PERFORMANCE.md), so that one figure compares with
# the link's speed whatever the rank count:
#   AllReduce 2(n-1)/n: a ring sends and receives 2(n-1)/n of the buffer per rank;
#   ReduceScatter, AllGather, AllToAll (n-1)/n: each rank moves every chunk but its own once;
#   Broadcast (and anything else) 1: every byte crosses one link per pipelined hop.

def bus_factor(op: str, ranks: int) -> float:
    if op == "all_reduce":
        return 2.0 * (ranks - 1) / ranks
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (ranks - 1) / ranks
    return 1.0


def clip(text: str, limit: int = 200) -> str:
    """At most `limit` characters of a library's message, cut at a word and marked, never mid-word."""
    text = " ".join(str(text).split())
    if len(text) <= limit:
        return text
    cut = text[:limit].rsplit(" ", 1)[0].rstrip(" ,;:")
    return cut + " ..."
