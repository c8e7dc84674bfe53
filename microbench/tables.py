"""Text output. Collective results use the nccl-tests layout so they read side by side."""

from __future__ import annotations

from typing import Any

from .expected import describe as describe_expected
from .sizes import format_bytes_human, format_size

_HEAD = ("#                                                              out-of-place"
         "                       in-place          \n"
         "#       size         count      type   redop    root     time   algbw   busbw #wrong"
         "     time   algbw   busbw #wrong\n"
         "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)       "
         "     (us)  (GB/s)  (GB/s)       ")


def _cells(row: dict[str, Any] | None) -> str:
    if row is None:
        return f"{'-':>9}{'-':>8}{'-':>8}{'-':>7}"
    wrong = "N/A" if row.get("nwrong") is None else str(row["nwrong"])
    return f"{row['time_us']['p50']:>9.1f}{row['algbw_gbps']:>8.2f}{row['busbw_gbps']:>8.2f}{wrong:>7}"


def collective_table(op: str, rows: list[dict[str, Any]], fit: dict[str, Any] | None,
                     link_gbps: float | None = None, expected: dict[str, Any] | None = None) -> str:
    known = bool(expected and expected.get("gbps"))
    lines = [f"# {op}", _with_expected_head(_HEAD) if known else _HEAD]
    by_size: dict[int, dict[str, dict[str, Any]]] = {}
    for row in rows:
        by_size.setdefault(row["size_bytes"], {})[row.get("placement", "out")] = row
    for size in sorted(by_size):
        pair = by_size[size]
        first = pair.get("out") or pair.get("in")
        assert first is not None
        lines.append(f"{size:>12}{first['count']:>14}{_dtype(first['dtype']):>10}{first['redop']:>8}"
                     f"{first['root']:>8}{_cells(pair.get('out'))}{_cells(pair.get('in'))}"
                     + (_expected_cell(pair, expected) if known else ""))
    if fit and fit.get("points"):
        lines.append(
            f"# fit ({'out-of-place' if fit['placement'] == 'out' else 'in-place'}): latency {fit['latency_us']:.1f} us, peak busbw "
            f"{'>= ' if fit.get('peak_is_lower_bound') else ''}{fit['peak_busbw_gbps']:.2f} GB/s, half of peak at {format_bytes_human(fit['half_peak_size_bytes'])}")
        avg = fit["avg_busbw_bw_bound_gbps"]
        share = f" = {100 * avg / link_gbps:.0f}% of the measured link ({link_gbps:.2f} GB/s)" if link_gbps else ""
        lines.append(f"# avg busbw over bandwidth-bound sizes ({fit['bw_bound_basis']}, {fit['bw_bound_sizes']}): "
                     f"{avg:.2f} GB/s{share}")
        if known:
            lines.append(f"# fit peak busbw {fit['peak_busbw_gbps']:.2f} GB/s = "
                         f"{100 * fit['peak_busbw_gbps'] / expected['gbps']:.0f}% of expected")
    if expected:
        lines.append(f"# {describe_expected(expected)}")
    return "\n".join(lines)


# `% of expected` rides at the end of the nccl-tests layout, so that layout's own columns stay
# where nccl-tests users look for them; it is the out-of-place busbw's share (in-place where the
# op has only that), the column nccl-tests summaries quote.
_EXP_WIDTH = 15


def _with_expected_head(head: str) -> str:
    first, second, third = head.split("\n")
    return "\n".join([first + " " * _EXP_WIDTH, second + f"{'% of expected':>{_EXP_WIDTH}}",
                      third + f"{'(busbw)':>{_EXP_WIDTH}}"])


def _expected_cell(pair: dict[str, dict[str, Any]], expected: dict[str, Any]) -> str:
    row = pair.get("out") or pair.get("in")
    pct = 100 * row["busbw_gbps"] / expected["gbps"] if row else None
    return f"{pct:>{_EXP_WIDTH - 1}.0f}%" if pct is not None else f"{'-':>{_EXP_WIDTH}}"


def _dtype(name: str) -> str:
    return {"float32": "float", "float16": "half"}.get(name, name)


def size_label(size_bytes: int) -> str:
    return format_size(size_bytes)


def profiles_table(records: list[tuple[str, dict[str, Any]]]) -> str:
    """The same sweep under several link profiles: busbw side by side and last/first ratio."""
    labels = [label for label, _ in records]
    first, last = labels[0], labels[-1]
    lines = [f"# busbw (GB/s) by link profile; ratio = {last} / {first}"]
    head = f"#{'op':>15}{'size':>10}" + "".join(f"{label:>12}" for label in labels) + f"{'ratio':>9}"
    lines.append(head)
    ops = list(dict.fromkeys(r["op"] for _, rec in records for r in rec["rows"]))
    for op in ops:
        sizes = sorted({r["size_bytes"] for _, rec in records for r in rec["rows"] if r["op"] == op})
        for size in sizes:
            values = []
            for _, rec in records:
                rows = [r for r in rec["rows"] if r["op"] == op and r["size_bytes"] == size]
                # Out-of-place where the op has it, as the nccl-tests summary does.
                row = next((r for r in rows if r.get("placement") == "out"), rows[0] if rows else None)
                values.append(row["busbw_gbps"] if row else None)
            cells = "".join(f"{v:>12.3f}" if v is not None else f"{'-':>12}" for v in values)
            ratio = (f"{values[-1] / values[0]:>8.2f}x" if values[0] and values[-1] is not None
                     else f"{'-':>9}")
            lines.append(f" {op:>15}{format_size(size):>10}{cells}{ratio}")
    return "\n".join(lines)
