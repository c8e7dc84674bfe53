"""Text tables for people: tabulate, with every number in plain decimals.

tabulate on its own parses any cell that looks like a number, strings included, and prints it
with "g": a formatted "0.0000123" becomes "1.23e-05" and a rate of 25600.0 may become
"2.56e+04". Tables here format numbers once (units.format_number: significant digits, never an
exponent), turn tabulate's parsing off, and right-align the columns whose cells are numbers, as
its parsing did.
"""

from __future__ import annotations

import re
from typing import Any, Iterable, Sequence

from .units import format_number

# A cell that reads as a number, with an optional unit or mark after it ("12.5", "-3", "1.2%",
# "4 (by load)"): right-aligned like tabulate's own numbers.
_NUMERIC = re.compile(r"^\s*[-+]?\d[\d,]*(\.\d+)?\s*%?\s*$")


def cell(value: Any, digits: int = 6) -> str:
    if isinstance(value, float):
        return format_number(value, digits)
    return "" if value is None else str(value)


def text_table(
    rows: Iterable[Sequence[Any]],
    headers: Sequence[str] = (),
    tablefmt: str = "simple",
    digits: int = 6,
    **options: Any,
) -> str:
    """tabulate(rows, headers) with floats to `digits` significant digits (tabulate's own 6) and no scientific
    notation; strings are printed as given."""
    from tabulate import tabulate

    texts = [[cell(value, digits) for value in row] for row in rows]
    width = max([len(headers)] + [len(row) for row in texts])
    align = []
    for column in range(width):
        cells = [row[column] for row in texts if column < len(row) and row[column] not in ("", "-")]
        align.append("right" if cells and all(_NUMERIC.match(c) for c in cells) else "left")
    options.setdefault("colalign", align)
    return tabulate(texts, headers=list(headers), tablefmt=tablefmt, disable_numparse=True, **options)
