"""S3 plumbing shared by the S3 probe and S3 checkpoint targets: which endpoint and credentials,
a botocore client sized for the concurrency, a fast pre-flight check, one-line error messages,
and cleanup of everything under a prefix.

botocore, not boto3: the low-level client is the same object, and botocore is what s3fs (through
aiobotocore) already pins, so the `s3` extra resolves at once instead of pip backtracking
between boto3's and aiobotocore's botocore ranges.

Credentials come from the standard AWS chain (AWS_ACCESS_KEY_ID/..., AWS_PROFILE, the shared
credentials file, instance roles) or are generated for the embedded server. They are never
put in a message, a config dict or a record: only where they came from is (e.g. "env").
"""

from __future__ import annotations

import os
import re
import secrets
import socket
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from ..core.errors import MicrobenchError, RunError, UsageError
from ..core.redaction import redact_text
from .s3_deadline import Endpoint, arm
from .s3server import REGION, Credentials, EmbeddedS3

_CREDENTIAL_CODES = ("SignatureDoesNotMatch", "InvalidAccessKeyId", "InvalidClientTokenId",
                     "InvalidToken", "ExpiredToken", "AuthorizationHeaderMalformed")


def s3_client_unavailable_reason() -> str | None:
    try:
        import botocore  # noqa: F401
    except ImportError:
        return "botocore is not installed (from the microbench checkout: pip install '.[s3]')"
    return None


def public_url(url: str) -> str:
    """The endpoint without any user:password@ part, for messages and records. Text only: the
    parsed port is never read here (urlsplit raises ValueError on a bad one, and this is what
    the message about a bad URL quotes)."""
    parts = urlsplit(url)
    if "@" in parts.netloc:
        netloc = parts.netloc.rsplit("@", 1)[1]
        return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
    return redact_text(url)   # an '@' further on: a password the parser did not see as one


_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")


def bucket_problem(name: str) -> str | None:
    """Why S3 would refuse `name` as a bucket (its naming rules: 3-63 of a-z, 0-9, '.' and
    '-', a letter or digit at each end, no '..', not an IP address), or None."""
    if not _BUCKET.fullmatch(name):
        return "expected an S3 bucket name: 3-63 of a-z, 0-9, '.' and '-', a letter or digit at each end"
    if ".." in name:
        return "an S3 bucket name has no '..'"
    if re.fullmatch(r"\d+\.\d+\.\d+\.\d+", name):
        return "an S3 bucket name is not an IP address"
    return None


def check_bucket(name: str, flag: str = "--bucket", quoted: str | None = None) -> str:
    """`name` if S3 would take it as a bucket, else UsageError quoting `quoted` (default the
    name) as typed for `flag`."""
    why = bucket_problem(name)
    if why:
        example = "--target s3://my-bucket/run1" if flag == "--target" else f"{flag} my-bucket"
        raise UsageError(f"invalid {flag} {quoted if quoted is not None else name!r}: {why}, e.g. {example}")
    return name


def check_endpoint(url: str) -> str:
    parts = urlsplit(url)
    if "@" in url and "@" not in parts.netloc and parts.scheme in ("http", "https"):
        raise UsageError(
            f"invalid --endpoint {public_url(url)!r}: the user:password before '@' holds a '/', '?' "
            f"or '#', which ends a URL's host part; percent-encode it: a password pa/ss is written pa%2Fss"
        )
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"invalid --endpoint {public_url(url)!r}: expected an http(s) URL, "
                         f"e.g. --endpoint http://127.0.0.1:9000")
    try:
        _ = parts.port   # urllib parses the port only when asked, raising ValueError
    except ValueError:
        raise UsageError(f"invalid --endpoint {public_url(url)!r}: bad port (a number from 1 to 65535); "
                         f"e.g. --endpoint http://127.0.0.1:9000") from None
    return url


@dataclass
class Target:
    """Where requests go. `embedded` is set when microbench runs the server itself."""

    endpoint_url: str | None
    region: str | None = None
    addressing_style: str = "path"
    credentials: Credentials | None = field(default=None, repr=False)  # None: the AWS chain
    embedded: EmbeddedS3 | None = None
    # The command's --timeout, where it has one: every request (connect to last byte) and the
    # pre-flight check must finish within it (targets/s3_deadline.py). None: the client's defaults.
    timeout_s: float | None = None
    _deadlines: Endpoint | None = field(default=None, repr=False, compare=False)

    @classmethod
    def for_embedded(cls, server: EmbeddedS3) -> "Target":
        return cls(server.endpoint_url, REGION, "path", server.credentials, server)

    def session(self) -> Any:
        import botocore.session

        check_profile()
        session = botocore.session.get_session()
        if self.credentials is not None:
            session.set_credentials(self.credentials.access_key_id, self.credentials.secret_access_key)
            session.set_config_variable("region", self.region or REGION)
            return session
        if self.region:
            session.set_config_variable("region", self.region)
        return session

    def credential_source(self, session: Any | None = None) -> str:
        if self.credentials is not None:
            return "generated for the embedded server" if self.embedded else "given"
        creds = (session or self.session()).get_credentials()
        if creds is None:
            raise UsageError("no AWS credentials found for --endpoint: set AWS_ACCESS_KEY_ID and "
                             "AWS_SECRET_ACCESS_KEY or AWS_PROFILE, or leave out --endpoint to use the "
                             "embedded server")
        return str(getattr(creds, "method", "unknown"))

    def client(self, *, pool: int = 10, connect_timeout_s: float | None = None, read_timeout_s: float | None = None,
               attempts: int = 3, session: Any | None = None) -> Any:
        """A botocore client; `attempts` in all (the first and its retries). Timeouts default to
        10 s to connect (or the target's timeout_s if less) and the target's timeout_s, else
        60 s, per read. With a timeout_s on the target, every request must also finish, connect
        to last byte, within read_timeout_s."""
        from botocore.config import Config

        connect_timeout_s = connect_timeout_s or min(self.timeout_s or 10.0, 10.0)
        read_timeout_s = read_timeout_s or self.timeout_s or 60.0
        session = session or self.session()
        https = (self.endpoint_url or "https://").startswith("https")
        config = Config(
            region_name=session.get_config_variable("region") or REGION, max_pool_connections=pool,
            connect_timeout=connect_timeout_s, read_timeout=read_timeout_s,
            retries={"total_max_attempts": attempts, "mode": "standard"},
            # Over plain http botocore would SHA-256 every payload in Python; https (real S3)
            # never does. The CRC32 checksum header still guards every part's integrity.
            s3={"addressing_style": self.addressing_style, "payload_signing_enabled": False},
            tcp_keepalive=True)
        client = session.create_client("s3", endpoint_url=self.endpoint_url, config=config,
                                       use_ssl=https if self.endpoint_url else True)
        if self.timeout_s is None:
            return client
        if self._deadlines is None:
            self._deadlines = Endpoint(public_url(self.endpoint_url or "AWS S3"))
        return arm(client, self._deadlines, read_timeout_s)

    def describe(self) -> dict[str, Any]:
        if self.embedded is not None:
            return self.embedded.describe()
        return {"target": "endpoint", "endpoint": public_url(self.endpoint_url or "aws default"),
                "region": self.region}


def check_profile() -> None:
    """An AWS_PROFILE the AWS config files lack fails botocore and s3fs at their first call, the
    embedded server's too (its keys are given, but the profile is still read): refused before
    any work, one line (exit 2)."""
    name = os.environ.get("AWS_PROFILE") or os.environ.get("AWS_DEFAULT_PROFILE")
    if name is None:
        return
    import botocore.session
    from botocore.exceptions import ProfileNotFound

    try:
        botocore.session.get_session().get_scoped_config()
    except ProfileNotFound:
        raise UsageError(f"AWS profile {name!r} not found in the AWS config files; set AWS_PROFILE to an existing "
                         f"profile or unset it") from None


def unique_prefix() -> str:
    host = "".join(c if c.isalnum() else "-" for c in socket.gethostname())[:40]
    return f"microbench-s3/{host}-{os.getpid()}-{secrets.token_hex(4)}/"


def translate(exc: BaseException, target: Target, bucket: str, cred_source: str, doing: str) -> MicrobenchError:
    """One-line error for a botocore failure: unreachable, credentials, bucket, other."""
    from botocore import exceptions as bx

    where = public_url(target.endpoint_url or "AWS S3")
    if isinstance(exc, bx.HTTPClientError) and isinstance(exc.kwargs.get("error"), MicrobenchError):
        exc = exc.kwargs["error"]   # a request deadline (s3_deadline.py) met while sending
    if isinstance(exc, MicrobenchError):
        return exc
    if isinstance(exc, (bx.EndpointConnectionError, bx.ConnectTimeoutError, bx.ConnectionClosedError)):
        return RunError(f"cannot reach S3 endpoint {where!r} while {doing}: {_first_line(exc)}; "
                        f"check --endpoint (e.g. --endpoint http://127.0.0.1:9000) or leave it out to use "
                        f"the embedded server")
    if isinstance(exc, bx.ReadTimeoutError):
        return RunError(f"S3 endpoint {where!r} stopped answering while {doing} (read timeout)")
    if isinstance(exc, bx.NoCredentialsError):
        return UsageError("no AWS credentials found for --endpoint: set AWS_ACCESS_KEY_ID and "
                          "AWS_SECRET_ACCESS_KEY or AWS_PROFILE, or leave out --endpoint to use the embedded server")
    if isinstance(exc, bx.ClientError):
        error = exc.response.get("Error", {})
        code = str(error.get("Code", ""))
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if code in ("NoSuchBucket",) or (code in ("404", "NotFound") and doing.startswith("checking")):
            return UsageError(f"bucket {bucket!r} does not exist at {where!r}; create it first or pick "
                              f"an existing one, e.g. --bucket my-bucket")
        if code == "EntityTooSmall":
            return UsageError(f"S3 endpoint {where!r} refused parts this small (EntityTooSmall): "
                              f"use --part-size 5M or more")
        if code in _CREDENTIAL_CODES:
            return RunError(f"S3 endpoint {where!r} rejected the credentials (from {cred_source}): {code}; "
                            f"check AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE")
        if code in ("403", "AccessDenied", "Forbidden") or status == 403:
            return RunError(f"S3 endpoint {where!r} denied access to bucket {bucket!r} while {doing} "
                            f"(HTTP 403): wrong credentials (from {cred_source}) or no permission")
        message = str(error.get("Message", "")) or _first_line(exc)
        return RunError(f"S3 request failed while {doing} at {where!r}: {code or status}: {message[:200]}")
    if isinstance(exc, bx.BotoCoreError):
        return RunError(f"S3 client error while {doing} at {where!r}: {_first_line(exc)}")
    if isinstance(exc, OSError):
        return RunError(f"I/O error while {doing} at {where!r}: {_first_line(exc)}")
    raise exc


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]


def preflight(target: Target, bucket: str, *, timeout_s: float | None = None) -> str:
    """Fail fast (one attempt, connect and answer within `timeout_s`, default the target's
    timeout_s, else 10 s) before anything is written. Returns where the credentials came from."""
    from botocore import exceptions as bx

    timeout_s = timeout_s or target.timeout_s or 10.0
    session = target.session()
    source = target.credential_source(session)
    client = target.client(pool=1, connect_timeout_s=timeout_s, read_timeout_s=timeout_s, attempts=1,
                           session=session)
    try:
        client.head_bucket(Bucket=bucket)
    except bx.ClientError as exc:
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if status == 403:
            # HEAD answers carry no error code; a listing says whether the signature was wrong.
            try:
                client.list_objects_v2(Bucket=bucket, MaxKeys=1)
            except Exception as inner:  # noqa: BLE001 - translated below
                raise translate(inner, target, bucket, source, "checking the bucket") from None
        raise translate(exc, target, bucket, source, "checking the bucket") from None
    except Exception as exc:  # noqa: BLE001
        raise translate(exc, target, bucket, source, "checking the bucket") from None
    return source


def delete_prefix(client: Any, bucket: str, prefix: str) -> int:
    """Delete every object under `prefix` and abort its unfinished multipart uploads."""
    deleted = 0
    try:
        uploads = client.list_multipart_uploads(Bucket=bucket, Prefix=prefix).get("Uploads", [])
    except Exception:  # noqa: BLE001 - some servers lack this call; aborts below cover ours
        uploads = []
    for upload in uploads:
        try:
            client.abort_multipart_upload(Bucket=bucket, Key=upload["Key"], UploadId=upload["UploadId"])
        except Exception:  # noqa: BLE001
            pass
    token = None
    while True:
        kwargs = {"Bucket": bucket, "Prefix": prefix, **({"ContinuationToken": token} if token else {})}
        page = client.list_objects_v2(**kwargs)
        keys = [obj["Key"] for obj in page.get("Contents", [])]
        for key in keys:
            client.delete_object(Bucket=bucket, Key=key)
            deleted += 1
        if not page.get("IsTruncated"):
            return deleted
        token = page.get("NextContinuationToken")
