"""A deadline on every S3 request microbench's botocore clients make: connect to last byte within
the command's --timeout, however the endpoint stalls.

botocore's read timeout bounds each socket read, not a request: an endpoint that accepts and
never answers costs a read timeout per attempt (and botocore retries a timeout), and one that
answers a byte now and then (a broken proxy, a wedged server) holds a request forever. Here the
sockets of botocore's connections check a per-thread deadline, set when a request is sent, at
every read and write, and give each blocking call only the time left. A request past its
deadline raises RequestDeadline, a RunError naming the endpoint that botocore does not retry;
from then on every request to that endpoint fails at once, so the clean-up after the failure
(aborting uploads, deleting the run's objects) does not wait out the deadline again.

A read waits in slices of at most WAIT_SLICE_S, calling `between_waits` (the command line sets
it to the interrupt check) between them: a Ctrl-C or SIGTERM whose first raise a library
swallowed while the process started still ends a request that would wait minutes.

Cost: one monotonic clock read and a settimeout per socket call, against milliseconds per request.
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from ..core.errors import RunError

_local = threading.local()  # end (monotonic s), the Endpoint being asked
_installed = False
_install_lock = threading.Lock()
WAIT_SLICE_S = 0.5
between_waits: Callable[[], None] | None = None


class RequestDeadline(RunError):
    """An S3 request that did not finish within the command's --timeout."""


@dataclass
class Endpoint:
    """One S3 endpoint as the deadlines see it: its name for messages, and why it is given up."""

    name: str
    stuck: str | None = None


def _checked(sock: Any, most_s: float | None = None) -> float | None:
    """The time this thread's request has left (the socket's timeout set to it, or to `most_s`
    if less), or None when no deadline is set; RequestDeadline when none is left."""
    end = getattr(_local, "end", None)
    if end is None:
        return None
    left = end - time.monotonic()
    if left <= 0:
        _expire()
    sock.settimeout(left if most_s is None else min(left, most_s))
    return left


def _expire() -> None:
    endpoint: Endpoint = _local.endpoint
    _local.end = None
    endpoint.stuck = endpoint.stuck or (
        f"S3 endpoint {endpoint.name!r} did not finish a request within {_local.timeout_s:g} s (--timeout): "
        f"it accepts connections but does not answer, or answers too slowly; check the endpoint or raise --timeout"
    )
    raise RequestDeadline(endpoint.stuck)


class _Deadlines:
    """Socket calls that http.client and urllib3 make, each bounded by the deadline."""

    __slots__ = ()

    def _bounded(self, call: Any, *args: Any, sliced: bool = False) -> Any:
        """One socket call within the deadline. A read (`sliced`) waits in slices of
        WAIT_SLICE_S (a read that timed out took nothing); a write gets the time left at once
        (one that timed out may have sent part of its bytes, so it is never repeated)."""
        while True:
            if _checked(self, WAIT_SLICE_S if sliced else None) is None:
                return call(*args)
            try:
                return call(*args)
            except TimeoutError:
                if time.monotonic() >= _local.end:
                    _expire()
                if not sliced:
                    raise
                if between_waits is not None:
                    between_waits()

    def recv_into(self, *args: Any) -> Any:
        return self._bounded(super().recv_into, *args, sliced=True)  # type: ignore[misc]

    def recv(self, *args: Any) -> Any:
        return self._bounded(super().recv, *args, sliced=True)  # type: ignore[misc]

    def sendall(self, *args: Any) -> Any:
        return self._bounded(super().sendall, *args)  # type: ignore[misc]

    def send(self, *args: Any) -> Any:
        return self._bounded(super().send, *args)  # type: ignore[misc]


class _Socket(_Deadlines, socket.socket):
    __slots__ = ()


_SWAP: dict[type, type] = {socket.socket: _Socket}


def _install() -> None:
    """Once per process: botocore's connections, once connected, take the bounded sockets."""
    global _installed
    with _install_lock:
        if _installed:
            return
        import ssl

        from botocore.awsrequest import AWSHTTPConnection, AWSHTTPSConnection

        class _SSLSocket(_Deadlines, ssl.SSLSocket):
            pass

        _SWAP[ssl.SSLSocket] = _SSLSocket

        for cls in (AWSHTTPConnection, AWSHTTPSConnection):

            def connect(self: Any, _original: Any = cls.connect) -> None:
                _original(self)
                swapped = _SWAP.get(type(self.sock))
                if swapped is not None:
                    self.sock.__class__ = swapped

            cls.connect = connect
        _installed = True


def arm(client: Any, endpoint: Endpoint, timeout_s: float) -> Any:
    """Every request `client` sends must finish within `timeout_s`; returns the client."""
    _install()

    def before_send(**_: Any) -> None:
        if endpoint.stuck:
            raise RequestDeadline(endpoint.stuck)
        _local.end, _local.endpoint, _local.timeout_s = time.monotonic() + timeout_s, endpoint, timeout_s

    client.meta.events.register("before-send.s3", before_send)
    return client
