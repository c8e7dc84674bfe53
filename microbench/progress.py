"""Progress for long sweeps: a live bar on stderr on a terminal (fio's --eta=auto); when
nothing is a terminal (srun, CI, `| tee`), one line on stdout per finished case, flushed, so a
log shows progress as it happens rather than everything at the end. Only rank 0 shows either."""

from __future__ import annotations

import sys
import time
from typing import Any


def row_brief(row: dict[str, Any]) -> str:
    """The number a reader of a log wants per finished case: its headline bandwidth, else latency."""
    values = {k: v for k, v in row.items()
              if k.endswith("_gbps") and "ceiling" not in k and isinstance(v, (int, float))}
    for key in ("busbw_gbps", "copy_gbps", "read_gbps", "write_gbps", "throughput_gbps", "bw_gbps"):
        if key in values:
            return f"{key.removesuffix('_gbps')} {values[key]:.3g} GB/s"
    if values:
        key, value = next(iter(values.items()))
        return f"{key.removesuffix('_gbps')} {value:.3g} GB/s"
    if isinstance(row.get("rtt_us_p50"), (int, float)):
        return f"rtt p50 {row['rtt_us_p50']:.1f} us"
    time_us = row.get("time_us")
    if isinstance(time_us, dict) and isinstance(time_us.get("p50"), (int, float)):
        return f"time p50 {time_us['p50']:.1f} us"
    return "done"


class Progress:
    def __init__(self, total: int, desc: str, enabled: bool | None = None):
        self._lines = False
        if enabled is None:
            enabled = sys.stderr.isatty()
            self._lines = not enabled and not sys.stdout.isatty()
        self._bar: Any = None
        self._total, self._desc, self._done = total, desc, 0
        self._label = ""
        self._start = time.monotonic()
        if enabled and total > 0:
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=desc, file=sys.stderr, leave=False, dynamic_ncols=True,
                             bar_format="{desc} {bar} {n_fmt}/{total_fmt} [{elapsed}<{remaining}] {postfix}")

    def step(self, label: str) -> None:
        self._label = label
        if self._bar is not None:
            self._bar.set_postfix_str(label, refresh=False)

    def advance(self, row: dict[str, Any] | None = None) -> None:
        self._done += 1
        if self._bar is not None:
            self._bar.update(1)
        elif self._lines:
            brief = row_brief(row) if row else "done"
            print(f"# [{self._done}/{self._total}] {self._desc} {self._label}: {brief} "
                  f"({time.monotonic() - self._start:.1f} s)", flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
