"""Size parsing and formatting. Binary units when parsing (1K = 1024); GB/s means 1e9 bytes/s.

Accepted forms, as nccl-tests users expect: a single size (`64M`), a geometric range
(`1M-4G`, stepped by --factor), or a list (`1M,8M,64M`). Plain integers are bytes.
"""

from __future__ import annotations

import re

from .errors import UsageError

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE_RE = re.compile(r"^\s*(\d+)\s*([KMGT]?)(?:I?B)?\s*$", re.IGNORECASE)
_EXAMPLE = "e.g. 1M-4G, 64M or 1M,8M,64M"


def parse_size(text: str, *, what: str = "size", allow_zero: bool = False) -> int:
    """Parse one size like `4K`, `16M`, `2G`, `1048576` into bytes."""
    raw = str(text).strip()
    match = _SIZE_RE.match(raw)
    if not match:
        raise UsageError(
            f"invalid {what} {raw!r}: expected a whole number of bytes with an optional "
            f"binary suffix K, M, G or T (e.g. 4K, 16M, 2G)"
        )
    value = int(match.group(1)) * _UNITS[match.group(2).upper()]
    if value == 0 and not allow_zero:
        raise UsageError(f"invalid {what} {raw!r}: must be greater than zero (e.g. 1M)")
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
                f"with MIN <= MAX, e.g. {format_size(hi)}-{format_size(lo)}"
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


def format_size(size_bytes: int | float) -> str:
    """Short binary form: 1048576 -> '1M'; inexact multiples get one decimal, 1536 -> '1.5K'."""
    size = int(size_bytes)
    for suffix, unit in (("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if size >= unit and size % unit == 0:
            return f"{size // unit}{suffix}"
    for suffix, unit in (("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if size >= unit:
            return f"{size / unit:.1f}{suffix}"
    return f"{size}B" if size < 1024 else str(size)


def format_bytes_human(size_bytes: int | float) -> str:
    """'1.5 GiB' style, for messages about memory and disk space."""
    value = float(size_bytes)
    for suffix in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or suffix == "TiB":
            return f"{value:.0f} {suffix}" if suffix == "B" else f"{value:.1f} {suffix}"
        value /= 1024
    return f"{value:.1f} TiB"


def parse_positive_int(text: str | int, *, what: str, example: str = "4") -> int:
    try:
        value = int(str(text).strip())
    except ValueError:
        raise UsageError(f"invalid {what} {text!r}: expected a positive whole number, e.g. {example}") from None
    if value <= 0:
        raise UsageError(f"invalid {what} {text!r}: must be at least 1, e.g. {example}")
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
