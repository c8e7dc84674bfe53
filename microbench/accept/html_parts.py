"""The HTML pieces every section of `microbench report` is made of: escaped text, a table,
a number as a table shows it. Kept apart from the sections so that each section module (the
summary, the pictures, a section someone appends) builds with the same pieces."""

from __future__ import annotations

import html
from typing import Any, Sequence

from ..core.units import format_number


def escape(value: Any) -> str:
    return html.escape(str(value), quote=True)


def table(
    headers: Sequence[str],
    rows: Sequence[Sequence[Any]],
    classes: Sequence[Sequence[str]] | None = None,
    cls: str = "",
    raw: Sequence[int] = (),
) -> str:
    """An HTML table; cells are escaped text except the columns in `raw`, which are HTML the
    caller built from escaped parts (a picture, a line with a note under it)."""
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = []
    for i, row in enumerate(rows):
        cells = []
        for j, cell in enumerate(row):
            mark = classes[i][j] if classes and classes[i][j] else ""
            text = str(cell) if j in raw else escape(cell)
            cells.append(f"<td{f' class={chr(34)}{mark}{chr(34)}' if mark else ''}>{text}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return (
        f"<table{f' class={chr(34)}{cls}{chr(34)}' if cls else ''}><thead><tr>{head}</tr></thead>"
        f"<tbody>{''.join(body)}</tbody></table>"
    )


def number(value: Any) -> str:
    """Thousands grouped from 1,000 up, four significant digits below, never an exponent."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"{value:,.0f}" if abs(value) >= 1000 else format_number(value, 4)
    return "-" if value is None else str(value)
