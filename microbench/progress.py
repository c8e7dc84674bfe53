"""Progress on stderr for long sweeps: a live bar on a terminal, silence when piped (fio's
--eta=auto). Only rank 0 ever shows one."""

from __future__ import annotations

import sys
from typing import Any


class Progress:
    def __init__(self, total: int, desc: str, enabled: bool | None = None):
        if enabled is None:
            enabled = sys.stderr.isatty()
        self._bar: Any = None
        if enabled and total > 0:
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=desc, file=sys.stderr, leave=False, dynamic_ncols=True,
                             bar_format="{desc} {bar} {n_fmt}/{total_fmt} [{elapsed}<{remaining}] {postfix}")

    def step(self, label: str) -> None:
        if self._bar is not None:
            self._bar.set_postfix_str(label, refresh=False)

    def advance(self) -> None:
        if self._bar is not None:
            self._bar.update(1)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
