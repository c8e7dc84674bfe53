"""DCP's ways of returning a tensor, a future and a failure, read in one place."""

from __future__ import annotations

from typing import Any

from ...core.units import clip


def _local(tensor: Any) -> Any:
    """This rank's part: a DTensor's local shard, a replicated tensor itself."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def _result(future: Any) -> Any:
    # torch returns a Future, or an AsyncSaveResponse holding one when a stager is used.
    inner = getattr(future, "upload_completion", None) or future
    return inner.result()


def _failures(exc: BaseException) -> list[BaseException]:
    failures = getattr(exc, "failures", None)
    if not isinstance(failures, dict):
        return []
    return [err[0] if isinstance(err, tuple) else err for _, err in sorted(failures.items())]


def _was_interrupted(exc: BaseException) -> bool:
    return any(isinstance(inner, KeyboardInterrupt) for inner in _failures(exc))


def _dcp_cause(exc: BaseException) -> str:
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict) and failures:
        rank, err = sorted(failures.items())[0]
        inner = err[0] if isinstance(err, tuple) else err
        text = str(inner).strip().splitlines()
        return f"rank {rank}: {type(inner).__name__}: {clip(text[0]) if text else ''}"
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {clip(text[0]) if text else ''}"
