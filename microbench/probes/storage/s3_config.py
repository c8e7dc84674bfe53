"""The S3 probe's option table and the checks made before any server starts or request goes out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...core.errors import UsageError
from ...core.options import nbytes, one_of, option, positive_int, timeout

OPS = ("put", "get")
MAX_PARTS = 10_000  # S3's limit per multipart upload
MAX_PART_BYTES = 5 << 30  # S3's largest part
MAX_CONCURRENCY = 1024  # requests in flight: botocore's own transfer manager tops out far below


def _expected(text: Any, flag: str) -> dict[str, Any] | None:
    from ...expect.overrides import override

    return override(text)


def _endpoint(text: Any, flag: str) -> str:
    from ...targets.s3client import check_endpoint

    return check_endpoint(text)


@dataclass
class Config:
    endpoint: str | None = option(
        None,
        parse=_endpoint,
        metavar="URL",
        record=False,
        shown="embedded server",
        help="S3 endpoint, e.g. http://10.0.0.5:9000",
    )
    bucket: str | None = option(
        None, shown="'microbench' on the embedded server; required with --endpoint", help="existing bucket"
    )
    object_size: int = option(64 << 20, parse=nbytes, shown="64M", help="bytes per object")
    part_size: int = option(16 << 20, parse=nbytes, shown="16M", help="multipart part size, also the GET range size")
    concurrency: int = option(8, parse=positive_int, help="requests in flight at once")
    ops: list[str] = option(list(OPS), parse=one_of(OPS), shown="put,get", help="put, get or both")
    objects: int = option(1, parse=positive_int, help="objects per iteration")
    prefix: str = ""
    keep: bool = option(False, switch=True, help="keep the objects written (under a unique prefix)")
    timeout_s: float = option(
        60.0,
        parse=timeout,
        flag="--timeout",
        shown="60",
        help="seconds an S3 request may take, connect to last byte, before the endpoint counts as stuck",
    )
    region: str | None = option(None, record=False, shown="AWS config, else us-east-1", help="region for signing")
    addressing_style: str = option(
        "path",
        choices=("path", "virtual", "auto"),
        record=False,
        help="bucket in the path (what most non-AWS servers need) or in the host name",
    )
    expected: dict | None = option(
        None,
        parse=_expected,
        metavar="RATE",
        record=False,
        shown="",
        help="the throughput this hardware should reach, overriding what sysfs/NVML say, "
        "with a unit: e.g. 24GB/s or 200Gbit (results then show %% of it)",
    )


def validate(config: Config) -> Config:
    """Every flag checked before any server starts or any request goes out."""
    from dataclasses import replace

    from ...core.units import format_size, format_size_exact
    from ...targets.s3client import check_bucket, unique_prefix
    from ...targets.s3server import DEFAULT_BUCKET

    if config.endpoint and config.bucket is None:
        raise UsageError(
            "--endpoint needs --bucket: an existing bucket to write test objects into, e.g. --bucket my-bucket"
        )
    bucket = check_bucket(DEFAULT_BUCKET if config.bucket is None else config.bucket)
    config = replace(config, bucket=bucket, prefix=config.prefix or unique_prefix())
    if config.part_size > MAX_PART_BYTES:
        raise UsageError(
            f"invalid --part-size {format_size_exact(config.part_size)!r}: S3 parts are at most 5G, "
            f"e.g. --part-size 16M"
        )
    parts = -(-config.object_size // config.part_size)
    if parts > MAX_PARTS:
        need_mib = -(-config.object_size // (MAX_PARTS << 20))
        raise UsageError(
            f"invalid --part-size {format_size_exact(config.part_size)!r}: a "
            f"{format_size(config.object_size)} object would need {parts} parts, S3 allows "
            f"{MAX_PARTS}; e.g. --part-size {need_mib}M"
        )
    _check_concurrency(config)
    return config


def _check_concurrency(config: Config) -> None:
    """Each request in flight is a thread, a connection and, for a GET, a buffer: a count no
    machine runs (the process limit) or whose parts its memory cannot hold is refused here,
    not met as a thread that cannot start or an allocation that fails mid-run."""
    from ...core.units import format_bytes_human, memory_shortfall
    from ...world.policy import free_memory_bytes

    if config.concurrency > MAX_CONCURRENCY:
        raise UsageError(
            f"invalid --concurrency {config.concurrency}: at most {MAX_CONCURRENCY} requests in flight "
            f"(each a thread and a connection), e.g. --concurrency 64"
        )
    bound = config.concurrency * config.part_size + (200 << 20)
    shortfall = memory_shortfall(bound, free_memory_bytes("cpu"), "host memory")
    if shortfall:
        raise UsageError(
            f"invalid --concurrency {config.concurrency}: {config.concurrency} parts of "
            f"{format_bytes_human(config.part_size)} in flight {shortfall}; use a lower --concurrency "
            f"or a smaller --part-size"
        )
