"""The result record: one JSON document per run (pytest-benchmark's idea: stats as data).

Layout (schema_version 2):
  schema_version, tool {name, version}, kind (the probe or tool that produced it),
  status: "running" | "complete" | "partial" | "skipped", status_reason,
  started_at, ended_at (ISO 8601 UTC), argv, config (resolved, after defaults),
  environment (see microbench.world.environment), implementation {native, engine, transport, ...},
  rows: [ {probe, op, size_bytes, ..., time_us: {p50, p95, p99, max, min, mean, n}, <metric>, ...} ],
  summary: probe-specific aggregates (fits, ratios), may be empty.

Statuses: "running" while the writer works (left so only if it was killed), "complete",
"partial" (failed or interrupted: the finished rows are kept, status_reason says why),
"skipped" (the probe cannot run here: unavailable_reason or ProbeUnavailable; status_reason
says why, no rows).

Rows: every probe declares its row as a TypedDict (`ProbeRow` plus its own fields) next to its
Config, named by its `SPEC.row_schema`; the runner's columns are `ProbeRow`'s; a field written
for some ops only sits in the schema's total=False part. The runner checks each row it measured
against the whole schema before writing it (a mismatch is a bug: RunError). Every row written
(RecordWriter) or read (load_record: UsageError naming the file, the row and the field) must
carry IDENTITY_FIELDS, and every field the schema names must have its type where present: a
record from an earlier release of this version may lack a field added since, and a reader must
still take it. Keys a schema does not name are allowed. Tool records without a probe spec
(compose, verify, calibration, hunt) are checked at the envelope level only: rows are objects.

Metric names: `<quantity>_<unit>[_<statistic>]`, the unit always right after the quantity,
as time_us {p50, ...} flattens to time_us.p50: busbw_gbps, rtt_us_p50, lat_us_p99,
request_ms_p50, blocked_time_us, bw_gbit_s. Units: gbps (GB/s, 1e9 B/s), gbit_s, us, ms, s,
bytes, pct, fraction; a rate that is its own unit needs no quantity (tflops, iops). Counts are
plain nouns (iters, ranks, objects). The primary metric of a kind is its SPEC.metrics[0].

time_us over ranks: every statistic is the maximum over ranks of that rank's own statistic
(p50 is the slowest rank's median, mean the largest per-rank mean, min the largest per-rank
minimum): the step waits for its slowest rank, and nccl-tests reports the slowest rank too.
Bandwidths are computed from time_us.p50. per_rank_time_us_p50 keeps every rank's median.

Version 1 records read as version 2 through `upgrade` (load_record does it): storage latency
columns lat_p50_us/lat_p99_us/lat_p999_us/lat_max_us became lat_us_p50/.../lat_us_max, and
an upgraded record says `upgraded_from: 1`. In v1, time_us p50/p95/max were maxima over ranks
but p99/min/mean the rank with the largest median; upgraded records keep the values they had.

Readers must check schema_version; new fields may appear within a version, none disappear.
"""

from __future__ import annotations

import datetime as _dt
import functools
import re
import sys
import types
import typing
from typing import Any, TypedDict

from .. import __version__
from ..core.redaction import redact_text

SCHEMA_VERSION = 2
READABLE_VERSIONS = (1, 2)
# "failed" (v1) was never written: a failed run keeps its rows as "partial".
STATUSES = ("running", "complete", "partial", "skipped")
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


def new_record(
    kind: str,
    config: dict[str, Any],
    environment: dict[str, Any],
    implementation: dict[str, Any],
    argv: list[str] | None = None,
) -> dict[str, Any]:
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
        return {k: ("<redacted>" if is_secret_name(k) else redact(v)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact(v) for v in value]
    return value


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
        out.append(redact_text(arg))
    return out


class TimeUs(TypedDict):
    """Per-iteration time in microseconds; each statistic the maximum over ranks (see above)."""

    p50: float
    p95: float
    p99: float
    max: float
    min: float
    mean: float
    n: int  # timed iterations per rank


class ProbeRow(TypedDict):
    """The columns the runner writes in every probe's row."""

    probe: str
    op: str
    size_bytes: int
    iters: int
    warmup: int
    time_us: TimeUs
    slowest_rank: int  # the rank with the largest median
    per_rank_time_us_p50: list[float]
    nwrong: int | None  # None: --no-check, or not yet checked (checked_by)


# What every reader may index in any probe's row, in every record of versions 1 and 2.
IDENTITY_FIELDS = ("op", "size_bytes")

# v1 column -> v2 column (the metric naming rule: the unit right after the quantity).
V1_ROW_RENAMES = {
    "lat_p50_us": "lat_us_p50",
    "lat_p99_us": "lat_us_p99",
    "lat_p999_us": "lat_us_p999",
    "lat_max_us": "lat_us_max",
}


def upgrade(record: Any) -> Any:
    """A record of any readable version as the current version (a new dict; the argument is left
    as it was). Anything else is returned unchanged for check_record to name."""
    if not isinstance(record, dict) or record.get("schema_version") != 1:
        return record
    out = dict(record, schema_version=SCHEMA_VERSION, upgraded_from=1)
    rows = record.get("rows")
    if isinstance(rows, list):
        out["rows"] = [
            {V1_ROW_RENAMES.get(k, k): v for k, v in row.items()} if isinstance(row, dict) else row for row in rows
        ]
    return out


def check_record(record: dict[str, Any]) -> None:
    """Raise ValueError when a document is not a record this version can read: the envelope, then
    every row against its kind's row schema (see row_schema_for)."""
    if not isinstance(record, dict):
        raise ValueError(f"it holds a JSON {_json_type(record)}, not an object with schema_version, kind and rows")
    version = record.get("schema_version")
    if version != SCHEMA_VERSION:
        readable = " or ".join(str(v) for v in READABLE_VERSIONS)
        raise ValueError(
            f"schema_version {version!r} is not supported (expected {readable}; a newer microbench wrote it?)"
        )
    for key in ("kind", "status", "config", "environment", "implementation", "rows"):
        if key not in record:
            raise ValueError(f"record lacks {key!r}")
    if record["status"] not in STATUSES:
        raise ValueError(f"status {record['status']!r} is not one of {STATUSES}")
    rows = record["rows"]
    if not isinstance(rows, list):
        raise ValueError(f"its rows are not a list of objects (they are a JSON {_json_type(rows)})")
    check_rows(record, rows)


def check_rows(record: dict[str, Any], rows: list[Any], first_index: int = 0, *, complete: bool = False) -> None:
    """Raise ValueError naming the first row (its index in the record) that breaks the row schema
    of the record's kind; `rows` are the record's rows from `first_index` on. `complete`: every
    field the schema requires must be there (a row the runner just measured); otherwise only
    IDENTITY_FIELDS must, and the rest are type-checked where present (a record from an earlier
    release of this version may lack a field added since)."""
    schema = row_schema_for(str(record.get("kind", "")))
    for index, row in enumerate(rows, start=first_index):
        if not isinstance(row, dict):
            raise ValueError(f"its rows are not a list of objects (row {index} is a JSON {_json_type(row)})")
        if schema is not None:
            problem = row_problem(row, schema, complete=complete)
            if problem:
                raise ValueError(
                    f"row {index} {problem}; {record.get('kind')!r} rows follow "
                    f"{schema.__module__}.{schema.__qualname__}"
                )


def row_schema_for(kind: str) -> type | None:
    """The TypedDict a row of `kind` must match: its probe's row_schema (ProbeRow when the probe
    declares none); None for tool records (compose, verify, hunt), checked at the envelope only."""
    from ..core import registry

    spec = registry.find(kind)
    if spec is None:
        return None
    return spec.row_schema or ProbeRow


def row_problem(row: dict[str, Any], schema: type, where: str = "", *, complete: bool = True) -> str | None:
    """What is wrong with `row` against the TypedDict `schema`, as words that follow "row N";
    None when it matches. Keys the schema does not name are allowed."""
    hints = _hints(schema)
    required = schema.__required_keys__ if complete else (IDENTITY_FIELDS if not where else ())  # type: ignore[attr-defined]
    for key, expected in hints.items():
        name = f"{where}{key}"
        if key not in row:
            if key in required:
                return f"has no {name!r} ({_describe(expected)})"
            continue
        value = row[key]
        if _is_typeddict(expected) and isinstance(value, dict):
            inner = row_problem(value, expected, f"{name}.", complete=complete)
            if inner:
                return inner
        elif not _matches(value, expected):
            return f"has {name!r} = {_short(value)} (a JSON {_json_type(value)}), expected {_describe(expected)}"
    return None


@functools.lru_cache(maxsize=None)
def _hints(schema: type) -> dict[str, Any]:
    """A row schema's fields and types, resolved once: resolving them per row took 40 of the
    65 s that reading a thousand nodes' records took (`microbench fleet`)."""
    return typing.get_type_hints(schema)


@functools.lru_cache(maxsize=None)
def _is_typeddict(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, dict) and hasattr(tp, "__required_keys__")


@functools.lru_cache(maxsize=None)  # asked for every field of every row a reader checks
def _arms(tp: Any) -> tuple[Any, ...] | None:
    if typing.get_origin(tp) is typing.Union or isinstance(tp, types.UnionType):
        return typing.get_args(tp)
    return None


def _matches(value: Any, tp: Any) -> bool:
    arms = _arms(tp)
    if arms is not None:
        return any(_matches(value, arm) for arm in arms)
    if tp is Any:
        return True
    if tp is type(None) or tp is None:
        return value is None
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:  # JSON writes 2.0 as 2.0, but a number that happens to be whole may be an int
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is str:
        return isinstance(value, str)
    origin = typing.get_origin(tp) or tp
    if origin is list:
        args = typing.get_args(tp)
        return isinstance(value, list) and (not args or all(_matches(v, args[0]) for v in value))
    if origin is dict or _is_typeddict(tp):
        return isinstance(value, dict)
    return isinstance(value, origin) if isinstance(origin, type) else True


def _describe(tp: Any) -> str:
    arms = _arms(tp)
    if arms is not None:
        return " or ".join(_describe(arm) for arm in arms)
    names = {
        int: "an integer",
        float: "a number",
        str: "a string",
        bool: "true or false",
        type(None): "null",
        list: "a list",
        dict: "an object",
    }
    if tp in names:
        return names[tp]
    origin = typing.get_origin(tp)
    if origin is list:
        args = typing.get_args(tp)
        return f"a list of {_describe(args[0]).removeprefix('a ').removeprefix('an ')}s" if args else "a list"
    if _is_typeddict(tp) or origin is dict:
        return "an object"
    return getattr(tp, "__name__", str(tp))


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _json_type(value: Any) -> str:
    names = {dict: "object", list: "list", str: "string", bool: "boolean", int: "number", float: "number"}
    return "null" if value is None else names.get(type(value), type(value).__name__)
