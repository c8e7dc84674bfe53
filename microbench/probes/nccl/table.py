"""Text output. Collective results use the nccl-tests layout so they read side by side."""

from __future__ import annotations

from typing import Any

from ...core.units import NCCL_TESTS_DTYPE, format_bytes_human, format_size
from ...expect.formulas import describe as describe_expected

# The nccl-tests columns and their usual widths: (name, unit, width). The per-placement cells
# repeat for out-of-place and in-place.
_KEY_COLUMNS = (("size", "(B)", 12), ("count", "(elements)", 14), ("type", "", 10), ("redop", "", 8), ("root", "", 8))
_CELL_COLUMNS = (("time", "(us)", 9), ("algbw", "(GB/s)", 8), ("busbw", "(GB/s)", 8), ("#wrong", "", 7))


def _pad(text: str, width: int) -> str:
    # Always one space before a value, however wide: columns may shift but never run together.
    return " " + text.rjust(width - 1)


class CollectiveLayout:
    """Column widths of one nccl-tests table, from what is known: the sizes before the sweep
    (so lines can be printed as they finish), and the rows themselves once they exist."""

    def __init__(self, max_size_bytes: int = 0, max_count: int = 0, expected: dict[str, Any] | None = None):
        # `% of expected` rides at the end of the nccl-tests layout, so that layout's own columns
        # stay where nccl-tests users look for them.
        self.expected_gbps = expected.get("gbps") if expected else None
        self.key = [width for _, _, width in _KEY_COLUMNS]
        self.cell = [width for _, _, width in _CELL_COLUMNS]
        self.key[0] = max(self.key[0], len(str(max_size_bytes)) + 1)
        self.key[1] = max(self.key[1], len(str(max_count)) + 1)
        # Planned before any time is known: at 0.01 GB/s (a slow gloo link) a time in us has one
        # digit more than the size in bytes, plus ".d". A slower one still gets its space.
        self.cell[0] = max(self.cell[0], len(str(max_size_bytes)) + 2)

    @classmethod
    def for_rows(cls, rows: list[dict[str, Any]], expected: dict[str, Any] | None = None) -> "CollectiveLayout":
        """Widths for these rows; a skipped size's key row (no time) sizes the key columns only."""
        layout = cls(max((r["size_bytes"] for r in rows), default=0), max((r["count"] for r in rows), default=0),
                     expected)
        for row in rows:
            for index, text in enumerate(_cell_texts(row) if "time_us" in row else ()):
                layout.cell[index] = max(layout.cell[index], len(text) + 1)
            for index, text in enumerate(_key_texts(row)):
                layout.key[index] = max(layout.key[index], len(text) + 1)
        return layout

    def header(self) -> str:
        width_key, width_cell = sum(self.key), sum(self.cell)
        top = " " * width_key + "out-of-place".center(width_cell) + "in-place".center(width_cell)
        names = "".join(_pad(name, w) for (name, _, _), w in zip(_KEY_COLUMNS, self.key, strict=True))
        units = "".join(_pad(unit, w) for (_, unit, _), w in zip(_KEY_COLUMNS, self.key, strict=True))
        for _ in range(2):
            names += "".join(_pad(name, w) for (name, _, _), w in zip(_CELL_COLUMNS, self.cell, strict=True))
            units += "".join(_pad(unit, w) for (_, unit, _), w in zip(_CELL_COLUMNS, self.cell, strict=True))
        if self.expected_gbps:
            names += _pad("% of expected", _EXP_WIDTH)
            units += _pad("(busbw)", _EXP_WIDTH)
        return "\n".join("#" + line[1:] for line in (top.rstrip(), names, units))

    def line(self, pair: dict[str, dict[str, Any]], skipped: dict[str, str] | None = None) -> str:
        """One size: its out-of-place and in-place rows (either may be missing, or skipped: the
        placements in `skipped`, which `pair` may give as a key row without a time)."""
        first = pair.get("out") or pair.get("in")
        assert first is not None
        text = "".join(_pad(t, w) for t, w in zip(_key_texts(first), self.key, strict=False))
        for placement in ("out", "in"):
            row = pair.get(placement)
            if placement in (skipped or {}):
                cells: tuple[str, ...] = ("skipped",) + ("-",) * (len(self.cell) - 1)
            else:
                cells = _cell_texts(row) if row is not None and "time_us" in row else ("-",) * len(self.cell)
            text += "".join(_pad(t, w) for t, w in zip(cells, self.cell, strict=False))
        if self.expected_gbps:
            text += _pad(_expected_cell(pair, self.expected_gbps), _EXP_WIDTH)
        return text


_EXP_WIDTH = 15


def _expected_cell(pair: dict[str, dict[str, Any]], expected_gbps: float) -> str:
    # The out-of-place busbw's share (in-place where the op has only that): the column
    # nccl-tests summaries quote.
    row = next((r for r in (pair.get("out"), pair.get("in")) if r and "busbw_gbps" in r), None)
    return f"{100 * row['busbw_gbps'] / expected_gbps:.0f}%" if row else "-"


def skipped_rows(rows: list[dict[str, Any]], skipped: dict[int, dict[str, str]]) -> list[dict[str, Any]]:
    """Key rows (size, count, type, redop, root; no time) for the sizes of `skipped` that no
    measured row has: a size where every placement was skipped still gets its line."""
    if not rows:
        return []
    have = {r["size_bytes"] for r in rows}
    like = rows[0]
    elem = max(like["size_bytes"] // max(like["count"], 1), 1)
    return [{"size_bytes": size, "count": size // elem, "dtype": like["dtype"], "redop": like["redop"],
             "root": like["root"], "placement": next(iter(cells))}
            for size, cells in sorted(skipped.items()) if size not in have]


def skipped_note(skipped: dict[int, dict[str, str]]) -> list[str]:
    """Under a table: what was skipped and why."""
    return [f"# skipped {'out-of-place' if placement == 'out' else 'in-place'} at {size} B: {why}"
            for size, cells in sorted(skipped.items()) for placement, why in sorted(cells.items(), reverse=True)]


def _key_texts(row: dict[str, Any]) -> tuple[str, ...]:
    return (
        str(row["size_bytes"]),
        str(row["count"]),
        NCCL_TESTS_DTYPE.get(row["dtype"], row["dtype"]),
        str(row["redop"]),
        str(row["root"]),
    )


def _cell_texts(row: dict[str, Any]) -> tuple[str, ...]:
    wrong = "N/A" if row.get("nwrong") is None else str(row["nwrong"])
    return (f"{row['time_us']['p50']:.1f}", f"{row['algbw_gbps']:.2f}", f"{row['busbw_gbps']:.2f}", wrong)


def _by_size(rows: list[dict[str, Any]]) -> dict[int, dict[str, dict[str, Any]]]:
    by_size: dict[int, dict[str, dict[str, Any]]] = {}
    for row in rows:
        by_size.setdefault(row["size_bytes"], {})[row.get("placement", "out")] = row
    return dict(sorted(by_size.items()))


def fit_lines(fit: dict[str, Any] | None, link_gbps: float | None = None,
              expected: dict[str, Any] | None = None) -> list[str]:
    tail = [f"# {describe_expected(expected)}"] if expected else []
    if not fit or not fit.get("points"):
        return tail
    if expected and expected.get("gbps") and fit.get("fitted", True):
        tail.insert(0, f"# fit peak busbw {fit['peak_busbw_gbps']:.2f} GB/s = "
                       f"{100 * fit['peak_busbw_gbps'] / expected['gbps']:.0f}% of expected")
    if fit.get("fitted") is False:
        # A model more than core/fit's tolerance off the measured busbw at some size is worse
        # than none: say so, with why, and what was measured.
        best = fit["measured_max_busbw_gbps"]
        shares = [f"{100 * best / expected['gbps']:.0f}% of expected"] if expected and expected.get("gbps") else []
        shares += [f"{100 * best / link_gbps:.0f}% of the measured link ({link_gbps:.2f} GB/s)"] if link_gbps else []
        return [
            f"# fit ({'out-of-place' if fit['placement'] == 'out' else 'in-place'}): not fitted, {fit['not_fitted']}",
            f"# best measured busbw {best:.2f} GB/s at {format_bytes_human(fit['measured_max_size_bytes'])}"
            + (f" = {', '.join(shares)}" if shares else ""),
            *tail,
        ]
    avg = fit["avg_busbw_bw_bound_gbps"]
    share = f" = {100 * avg / link_gbps:.0f}% of the measured link ({link_gbps:.2f} GB/s)" if link_gbps else ""
    latency = (f"latency {fit['latency_us']:.1f} us, " if fit["latency_us"] > 0
               else "latency 0 (times proportional to size), ")
    return [f"# fit ({'out-of-place' if fit['placement'] == 'out' else 'in-place'}): {latency}"
            f"peak busbw {'>= ' if fit.get('peak_is_lower_bound') else ''}{fit['peak_busbw_gbps']:.2f} GB/s, "
            f"half of peak at {format_bytes_human(fit['half_peak_size_bytes'])}",
            f"# avg busbw over bandwidth-bound sizes ({fit['bw_bound_basis']}, {fit['bw_bound_sizes']}): "
            f"{avg:.2f} GB/s{share}", *tail]


def collective_table(op: str, rows: list[dict[str, Any]], fit: dict[str, Any] | None,
                     link_gbps: float | None = None, expected: dict[str, Any] | None = None,
                     title: str | None = None, skipped: dict[int, dict[str, str]] | None = None) -> str:
    """One op's table; `skipped`: size -> {placement: why} for the cases the memory plan skipped."""
    skipped = skipped or {}
    every = rows + skipped_rows(rows, skipped)
    layout = CollectiveLayout.for_rows(every, expected)
    lines = [f"# {title or op}", layout.header()]
    lines += [layout.line(pair, skipped.get(size)) for size, pair in _by_size(every).items()]
    return "\n".join(lines + skipped_note(skipped) + fit_lines(fit, link_gbps, expected))


class CollectiveStream:
    """The same tables, printed a line at a time as each size finishes, as nccl-tests does: under
    srun or a pipe, a long sweep shows its progress in its output rather than at the end.
    `cases` is the sweep's (op, size_bytes, placement, group) in the order they run; each op
    and group (--groups) is one table, titled from `titles` (group -> words)."""

    def __init__(self, cases: list[tuple[Any, ...]], elem_bytes: int, emit: Any = print,
                 link_gbps: float | None = None, expected: dict[str, dict[str, Any]] | None = None,
                 expected_groups: dict[str, dict[str, dict[str, Any]]] | None = None,
                 titles: dict[str, str] | None = None, skipped: dict[tuple[str, int], dict[str, str]] | None = None):
        self._per_curve_expected = {(op, "world"): e for op, e in (expected or {}).items()}
        self._per_curve_expected.update({(op, g): e for g, per_op in (expected_groups or {}).items()
                                         for op, e in per_op.items()})
        self._titles = titles or {}
        self._skipped = skipped or {}      # (op, size) -> {placement: why}: the memory plan's
        self._expected: dict[tuple[str, str, int], set[str]] = {}
        self._last_size: dict[tuple[str, str], int] = {}
        for op, size, placement, *group_of in cases:   # (op, size, placement) alone: the world's
            group = group_of[0] if group_of else None
            self._expected.setdefault((op, group or "world", size), set()).add(placement)
            self._last_size[(op, group or "world")] = size
        top = max([case[1] for case in cases] + [size for _, size in self._skipped], default=0)
        self._layout_args = (top, top // max(elem_bytes, 1))
        self._layouts: dict[tuple[str, str], CollectiveLayout] = {}
        self._emit, self._link_gbps = emit, link_gbps
        self._rows: dict[tuple[str, str], list[dict[str, Any]]] = {}
        self._pending: dict[tuple[str, str, int], dict[str, dict[str, Any]]] = {}

    def on_row(self, row: dict[str, Any]) -> None:
        op, size = row["op"], row["size_bytes"]
        curve = (op, row.get("group", "world"))
        if curve not in self._rows:
            self._layouts[curve] = CollectiveLayout(*self._layout_args, self._per_curve_expected.get(curve))
            title = f"{op}, {self._titles[curve[1]]}" if curve[1] in self._titles else op
            self._emit(f"# {title}\n{self._layouts[curve].header()}")
            self._rows[curve] = []
        self._rows[curve].append(row)
        pair = self._pending.setdefault((*curve, size), {})
        pair[row.get("placement", "out")] = row
        if set(pair) >= self._expected.get((*curve, size), set()):
            self._emit(self._layouts[curve].line(self._pending.pop((*curve, size)), self._skipped.get((op, size))))
            if size == self._last_size.get(curve):
                from ...core.fit import fit_latency_bandwidth

                link = self._link_gbps if curve[1] == "world" else None
                mine = {s: cells for (name, s), cells in self._skipped.items() if name == op}
                # Sizes skipped in every placement come after the last that ran: their lines now.
                self._emit("\n".join([self._layouts[curve].line({r["placement"]: r}, mine[r["size_bytes"]])
                                      for r in skipped_rows(self._rows[curve], mine)] + skipped_note(mine)
                                     + fit_lines(fit_latency_bandwidth(self._rows[curve]), link,
                                                 self._per_curve_expected.get(curve)) + [""]))


def groups_side_by_side(rows: list[dict[str, Any]], summary: dict[str, Any]) -> str:
    """--groups: each op's busbw per size, one column per group, and the cross groups' sum (they
    ran at once over the same NICs, so their sum is what the nodes' NICs carried)."""
    groups = list(summary.get("groups", {}))
    topo = summary.get("topology", {})
    lines = [f"# busbw (GB/s) by group, {topo.get('nodes')} nodes x {topo.get('ranks_per_node')} ranks "
             f"(from {topo.get('from')}); node and cross: one group's busbw, all groups of the kind at once"]
    cross = summary["groups"].get("cross")
    heads = [*groups, *(["cross x" + str(cross["groups_at_once"])] if cross else [])]
    lines.append(f"#{'op':>15}{'size':>10}" + "".join(f"{h:>12}" for h in heads))
    for op in dict.fromkeys(r["op"] for r in rows):
        table: dict[int, dict[str, float]] = {}
        for r in rows:
            if r["op"] == op and r.get("placement", "out") == _placement_of(rows, op):
                table.setdefault(r["size_bytes"], {})[r.get("group", "world")] = r["busbw_gbps"]
        for size, by_group in sorted(table.items()):
            cells = [by_group.get(g) for g in groups]
            if cross:
                one = by_group.get("cross")
                cells.append(None if one is None else one * cross["groups_at_once"])
            lines.append(f" {op:>15}{format_size(size):>10}" + "".join(f"{c:>12.3f}" if c is not None else f"{'-':>12}"
                                                                     for c in cells))
    return "\n".join(lines)


def _placement_of(rows: list[dict[str, Any]], op: str) -> str:
    # Out-of-place where the op has it, as the nccl-tests summary quotes.
    return "out" if any(r["op"] == op and r.get("placement", "out") == "out" for r in rows) else "in"
