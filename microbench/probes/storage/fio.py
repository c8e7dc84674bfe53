"""`microbench storage fio`: the storage posix workload through fio (fio_engine.py), a second
opinion on the native engine."""

from __future__ import annotations

from dataclasses import replace

from .fio_engine import fio_unavailable_reason
from .posix import SPEC as POSIX_SPEC
from .posix import PosixProbe


class FioProbe(PosixProbe):
    name = "storage_fio"
    tools = ("fio",)

    def unavailable_reason(self) -> str | None:
        return fio_unavailable_reason()


# The same workload, rows and metrics as storage posix, through another engine.
SPEC = replace(
    POSIX_SPEC, name="storage_fio", command=("storage", "fio"), order=45,
    help="the same file workload through fio (subprocess, JSON output)",
    build=lambda config, context=None: FioProbe(config), cli="microbench.commands.storage_fio", suite=(),
)
