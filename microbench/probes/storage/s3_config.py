"""The S3 probe's option table and the checks made before any server starts or request goes out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...core.errors import UsageError
from ...core.options import nbytes, one_of, option, positive_int, timeout

OPS = ("put", "get")
MAX_PARTS = 10_000          # S3's limit per multipart upload
MAX_PART_BYTES = 5 << 30    # S3's largest part


def _expected(text: Any, flag: str) -> dict[str, Any] | None:
    from ...expect.overrides import override

    return override(text)


def _endpoint(text: Any, flag: str) -> str:
    from ...targets.s3client import check_endpoint

    return check_endpoint(text)


@dataclass
class Config:
    endpoint: str | None = option(None, parse=_endpoint, metavar="URL", record=False, shown="embedded server",
                                  help="S3 endpoint, e.g. http://10.0.0.5:9000")
    bucket: str | None = option(None, shown="'microbench' on the embedded server; required with --endpoint",
                                help="existing bucket")
    object_size: int = option(64 << 20, parse=nbytes, shown="64M", help="bytes per object")
    part_size: int = option(16 << 20, parse=nbytes, shown="16M",
                            help="multipart part size, also the GET range size")
    concurrency: int = option(8, parse=positive_int, help="requests in flight at once")
    ops: list[str] = option(list(OPS), parse=one_of(OPS), shown="put,get", help="put, get or both")
    objects: int = option(1, parse=positive_int, help="objects per iteration")
    prefix: str = ""
    keep: bool = option(False, switch=True, help="keep the objects written (under a unique prefix)")
    timeout_s: float = option(10.0, parse=timeout, flag="--timeout", shown="10",
                              help="seconds to connect before the endpoint counts as unreachable")
    region: str | None = option(None, record=False, shown="AWS config, else us-east-1", help="region for signing")
    addressing_style: str = option("path", choices=("path", "virtual", "auto"), record=False,
                                   help="bucket in the path (what most non-AWS servers need) or in the host name")
    expected: dict | None = option(None, parse=_expected, metavar="RATE", record=False, shown="",
                                   help="the throughput this hardware should reach, overriding what sysfs/NVML say, "
                                        "with a unit: e.g. 24GB/s or 200Gbit (results then show %% of it)")


def validate(config: Config) -> Config:
    """Every flag checked before any server starts or any request goes out."""
    from dataclasses import replace

    from ...core.units import format_size, format_size_exact
    from ...targets.s3client import unique_prefix
    from ...targets.s3server import DEFAULT_BUCKET

    if config.endpoint and not config.bucket:
        raise UsageError("--endpoint needs --bucket: an existing bucket to write test objects into, "
                         "e.g. --bucket my-bucket")
    bucket = config.bucket or DEFAULT_BUCKET
    if not bucket.strip() or "/" in bucket:
        raise UsageError(f"invalid --bucket {bucket!r}: expected a bucket name without '/', e.g. --bucket my-bucket")
    config = replace(config, bucket=bucket, prefix=config.prefix or unique_prefix())
    if config.part_size > MAX_PART_BYTES:
        raise UsageError(f"invalid --part-size {format_size_exact(config.part_size)!r}: S3 parts are at most 5G, "
                         f"e.g. --part-size 16M")
    parts = -(-config.object_size // config.part_size)
    if parts > MAX_PARTS:
        need_mib = -(-config.object_size // (MAX_PARTS << 20))
        raise UsageError(f"invalid --part-size {format_size_exact(config.part_size)!r}: a "
                         f"{format_size(config.object_size)} object would need {parts} parts, S3 allows "
                         f"{MAX_PARTS}; e.g. --part-size {need_mib}M")
    return config
