"""`microbench storage fio`: the storage posix workload through fio (fio_engine.py), a second
opinion on the native engine."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from .fio_engine import fio_unavailable_reason
from .posix import SPEC as POSIX_SPEC, PosixProbe, Target, Workload
from .report import run_storage


class FioProbe(PosixProbe):
    name = "storage_fio"
    tools = ("fio",)

    def unavailable_reason(self) -> str | None:
        return fio_unavailable_reason()


def _run(spec: Any, config: Workload, inv: Any) -> Any:
    return run_storage(FioProbe, Target, config, inv, tools=("fio",))


# The same workload, rows and metrics as storage posix, through another engine.
SPEC = replace(
    POSIX_SPEC, name="storage_fio", command=("storage", "fio"), order=45,
    help="the same file workload through fio (subprocess, JSON output)",
    description="Run fio on a test file with the posix subcommand's workload flags.",
    config=Workload, run=_run, suite=(),
)
