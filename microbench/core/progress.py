"""Progress for long sweeps: a live bar on stderr on a terminal (fio's --eta=auto); when
nothing is a terminal (srun, CI, `| tee`), one line on stdout per finished case, flushed, so a
log shows progress as it happens rather than everything at the end. Only rank 0 shows either."""

from __future__ import annotations

import re
import sys
import time
from typing import Any

from . import registry
from .units import format_number


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def row_brief(row: dict[str, Any], record: dict[str, Any] | None = None) -> str:
    """The number a reader of a log wants per finished case: the primary metric its probe
    declares (the registry's), else a p50 latency."""
    key = registry.row_metric(row, record)
    if key is not None:
        value = row[key]
        shown = format_number(value)  # never 2.56e+04 in a log line
        return f"{key.removesuffix('_gbps')} {shown} GB/s" if key.endswith("_gbps") else f"{key} {shown}"
    for key, value in row.items():
        latency = re.fullmatch(r"(\w+)_us_p50", key)
        if latency and _number(value):
            return f"{latency.group(1)} p50 {value:.1f} us"
    time_us = row.get("time_us")
    if isinstance(time_us, dict) and _number(time_us.get("p50")):
        return f"time p50 {time_us['p50']:.1f} us"
    return "done"


class Progress:
    def __init__(self, total: int, desc: str, enabled: bool | None = None):
        self._lines = False
        self._record = {"kind": desc}  # desc is the probe's name: its spec says which number to show
        if enabled is None:
            enabled = sys.stderr.isatty()
            self._lines = not enabled and not sys.stdout.isatty()
        self._bar: Any = None
        self._total, self._desc, self._done = total, desc, 0
        self._label = ""
        self._start = time.monotonic()
        if enabled and total > 0:
            from tqdm import tqdm

            self._bar = tqdm(
                total=total,
                desc=desc,
                file=sys.stderr,
                leave=False,
                dynamic_ncols=True,
                bar_format="{desc} {bar} {n_fmt}/{total_fmt} [{elapsed}<{remaining}] {postfix}",
            )

    def step(self, label: str) -> None:
        self._label = label
        if self._bar is not None:
            self._bar.set_postfix_str(label, refresh=False)

    def advance(self, row: dict[str, Any] | None = None) -> None:
        self._done += 1
        if self._bar is not None:
            self._bar.update(1)
        elif self._lines:
            brief = row_brief(row, self._record) if row else "done"
            print(
                f"# [{self._done}/{self._total}] {self._desc} {self._label}: {brief} "
                f"({time.monotonic() - self._start:.1f} s)",
                flush=True,
            )

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
