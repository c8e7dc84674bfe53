"""Records under an S3 prefix (s3://bucket/prefix), as the fleet's nodes uploaded them: listed
once, read one object at a time. Credentials come from the AWS chain (targets/s3client.py);
`--endpoint` names a server other than AWS (MinIO, the embedded one in tests).

What goes wrong before anything is read is the caller's to fix (exit 2): a malformed URL, no
credentials, a bucket that does not exist, credentials the server refuses. A server that fails
after the listing, mid-read, is a failure of the run (exit 1)."""

from __future__ import annotations

from typing import Any, Callable, Iterator

from ...core.errors import MicrobenchError, RunError, UsageError


def split_url(url: str) -> tuple[str, str]:
    """s3://bucket/prefix -> (bucket, prefix), the prefix ending in / when not empty."""
    rest = str(url)[len("s3://"):]
    bucket, _, prefix = rest.partition("/")
    if not bucket or any(c in bucket for c in " *?"):
        raise UsageError(f"invalid source {url!r}: expected s3://BUCKET/PREFIX, e.g. s3://acceptance/run-1")
    return bucket, (prefix.rstrip("/") + "/") if prefix.strip("/") else ""


def _no_such_bucket(exc: BaseException) -> bool:
    response = getattr(exc, "response", None)
    return isinstance(response, dict) and response.get("Error", {}).get("Code") == "NoSuchBucket"


def _client(endpoint: str | None) -> tuple[Any, Any]:
    from ...targets.s3client import Target, check_endpoint, s3_client_unavailable_reason

    why = s3_client_unavailable_reason()
    if why:
        raise UsageError(f"reading s3:// records needs the S3 client: {why}")
    target = Target(check_endpoint(endpoint) if endpoint else None)
    session = target.session()
    target.credential_source(session)            # no credentials at all: a UsageError now
    return target, target.client(pool=4, attempts=2, session=session)


def objects(url: str, endpoint: str | None) -> Iterator[tuple[str, Callable[[], bytes | None]]]:
    """(s3://bucket/key, a function that reads it) for every *.json under the prefix."""
    from ...targets.s3client import public_url, translate

    bucket, prefix = split_url(url)
    target, client = _client(endpoint)
    keys: list[str] = []
    token = None
    try:
        while True:
            page = client.list_objects_v2(
                Bucket=bucket, Prefix=prefix, **({"ContinuationToken": token} if token else {})
            )
            keys += [o["Key"] for o in page.get("Contents", []) if o["Key"].endswith(".json")]
            if not page.get("IsTruncated"):
                break
            token = page.get("NextContinuationToken")
    except Exception as exc:  # noqa: BLE001 - every botocore failure becomes one line
        error = translate(exc, target, bucket, "the AWS chain", f"listing {url}")
        if _no_such_bucket(exc):
            # translate's example names the S3 probes' --bucket, which fleet does not have.
            error = UsageError(f"bucket {bucket!r} does not exist at {public_url(target.endpoint_url or 'AWS S3')!r}; "
                               f"expected s3://BUCKET/PREFIX in an existing bucket, e.g. s3://acceptance/run-1")
        # Refused before anything was read: the credentials or the place are the caller's to fix.
        raise UsageError(str(error)) if isinstance(error, MicrobenchError) else error from None

    def reader(key: str) -> Callable[[], bytes | None]:
        def read() -> bytes | None:
            try:
                return client.get_object(Bucket=bucket, Key=key)["Body"].read()
            except Exception as exc:  # noqa: BLE001
                error = translate(exc, target, bucket, "the AWS chain", f"reading s3://{bucket}/{key}")
                raise RunError(str(error)) from None
        return read

    for key in keys:
        yield f"s3://{bucket}/{key}", reader(key)
