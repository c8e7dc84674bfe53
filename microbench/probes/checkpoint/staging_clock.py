"""What dcp.async_save's blocking part spends its time on (the checkpoint probe's async_save case)."""

from __future__ import annotations

import time
from typing import Any


class StagingClock:
    """Times the part of dcp.async_save that blocks the caller's thread on the data: its stager
    (the writer itself, a BlockingAsyncStager) makes a CPU copy of the state before the call
    returns, and the write runs on in a thread. Inside that copy, where torch has them, the two
    steps apart: making the staged tensors (_create_cpu_state_dict) and copying into them
    (_copy_state_dict), wrapped only while this clock is entered, in this thread's call."""

    STEPS = {"_create_cpu_state_dict": "make", "_copy_state_dict": "copy"}

    def __init__(self, writer: Any) -> None:
        self.writer = writer
        self.spent: dict[str, float] = {}
        self._module: Any = None
        self._saved: dict[str, Any] = {}

    def __enter__(self) -> "StagingClock":
        stage = getattr(self.writer, "stage", None)
        if stage is None:    # DCP's own stager then: not timed
            return self
        self.writer.stage = self._timed("stage", stage)
        try:
            from torch.distributed.checkpoint import staging as module
        except ImportError:
            return self
        self._module = module
        for name, step in self.STEPS.items():
            if callable(getattr(module, name, None)):
                self._saved[name] = getattr(module, name)
                setattr(module, name, self._timed(step, self._saved[name]))
        return self

    def __exit__(self, *exc: Any) -> None:
        for name, original in self._saved.items():
            setattr(self._module, name, original)

    def _timed(self, key: str, fn: Any) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            begin = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.spent[key] = self.spent.get(key, 0.0) + time.perf_counter() - begin
        return timed
