"""The result record: one JSON document per run (pytest-benchmark's idea: stats as data).

Layout (schema_version 1):
  schema_version, tool {name, version}, kind (the probe or tool that produced it),
  status: "running" | "complete" | "partial" | "failed" | "skipped", status_reason,
  started_at, ended_at (ISO 8601 UTC), argv, config (resolved, after defaults),
  environment (see microbench.env), implementation {native, engine, transport, ...},
  rows: [ {probe, op, size_bytes, ..., time_us: {p50, p95, max, mean}, <metric>_gbps, ...} ],
  summary: probe-specific aggregates (fits, ratios), may be empty.

Readers must check schema_version; new fields may appear within a version, none disappear.
"""

from __future__ import annotations

import datetime as _dt
import re
import sys
from typing import Any

from .. import __version__

SCHEMA_VERSION = 1
STATUSES = ("running", "complete", "partial", "failed", "skipped")
# Keys whose values are credentials: they never reach a record, whatever a probe passes in.
_SECRET_HINTS = ("secret", "password", "passwd", "access_key", "auth_key", "credential", "api_key")
# Matched as a whole word only: "session_token" is a secret, "tokens_per_step" is not.
_SECRET_WORDS = ("token",)


def is_secret_name(name: str) -> bool:
    lowered = str(name).lower().replace("-", "_")
    words = re.split(r"[^a-z0-9]+", lowered)
    return any(h in lowered for h in _SECRET_HINTS) or any(w in words for w in _SECRET_WORDS)


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")


def new_record(kind: str, config: dict[str, Any], environment: dict[str, Any],
               implementation: dict[str, Any], argv: list[str] | None = None) -> dict[str, Any]:
    return {
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "microbench", "version": __version__},
        "kind": kind,
        "status": "running",
        "status_reason": None,
        "started_at": utc_now(),
        "ended_at": None,
        "argv": redact_argv(list(sys.argv if argv is None else argv)),
        "config": redact(config),
        "environment": environment,
        "implementation": implementation,
        "rows": [],
        "summary": {},
    }


def redact(value: Any) -> Any:
    """Drop secret-looking keys recursively so credentials never reach disk or stdout."""
    if isinstance(value, dict):
        return {k: ("<redacted>" if is_secret_name(k) else redact(v))
                for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact(v) for v in value]
    return value


_URL_PASSWORD = re.compile(r"(?P<head>[a-z][a-z0-9+.-]*://[^/@:\s]+:)[^/@\s]+@", re.IGNORECASE)


def _is_secret_flag(flag: str) -> bool:
    return flag.startswith("-") and is_secret_name(flag.lstrip("-"))


def redact_argv(argv: list[str]) -> list[str]:
    """A command line as it may be recorded: values of secret-looking flags
    (--secret-key X, --token=X) and passwords inside URLs (s3://user:pass@host) are replaced."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append("<redacted>")
            hide_next = False
            continue
        flag, eq, _ = arg.partition("=")
        if _is_secret_flag(flag):
            if eq:
                out.append(f"{flag}=<redacted>")
            else:
                out.append(arg)
                hide_next = True
            continue
        out.append(_URL_PASSWORD.sub(r"\g<head><redacted>@", arg))
    return out


def check_record(record: dict[str, Any]) -> None:
    """Raise ValueError when a document is not a record this version can read."""
    if not isinstance(record, dict):
        raise ValueError(f"it holds a JSON {_json_type(record)}, not an object with schema_version, kind and rows")
    version = record.get("schema_version")
    if version != SCHEMA_VERSION:
        raise ValueError(f"schema_version {version!r} is not supported (expected {SCHEMA_VERSION})")
    for key in ("kind", "status", "config", "environment", "implementation", "rows"):
        if key not in record:
            raise ValueError(f"record lacks {key!r}")
    if record["status"] not in STATUSES:
        raise ValueError(f"status {record['status']!r} is not one of {STATUSES}")
    rows = record["rows"]
    if not isinstance(rows, list):
        raise ValueError(f"its rows are not a list of objects (they are a JSON {_json_type(rows)})")
    for index, row in enumerate(rows):
        if not isinstance(row, dict):
            raise ValueError(f"its rows are not a list of objects (row {index} is a JSON {_json_type(row)})")


def _json_type(value: Any) -> str:
    names = {dict: "object", list: "list", str: "string", bool: "boolean", int: "number", float: "number"}
    return "null" if value is None else names.get(type(value), type(value).__name__)
