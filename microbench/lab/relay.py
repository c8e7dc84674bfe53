"""Servers on the launcher's loopback reached from a lab's hosts at the same address.

The embedded S3 server (and a bucket mount's own server) listen on 127.0.0.1 of the launching
network namespace; a rank placed on a lab host has a loopback of its own, so `http://127.0.0.1:PORT`
finds nothing there. The relay opens a listening socket at 127.0.0.1:PORT inside each host's
namespace (setns for the bind only: a socket stays in the namespace it was made in) and pumps
every connection to the same port here. Storage traffic thus takes the host's loopback and the
launcher's, never the lab's shaped links, as a node's storage network is not its training network.
Threads only; everything closes with the relay."""

from __future__ import annotations

import os
import socket
import threading
from typing import Any

CHUNK = 1 << 16
CLONE_NEWNET = 0x40000000


def _setns(fd: int) -> None:
    """setns(2) for a network namespace (os.setns is Python 3.12+)."""
    setns = getattr(os, "setns", None)
    if setns is not None:
        setns(fd, CLONE_NEWNET)
        return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def _listen_in(netns: str, port: int) -> socket.socket:
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(f"/var/run/netns/{netns}", os.O_RDONLY)
    try:
        _setns(target)
        try:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", port))
            sock.listen(64)
        finally:
            _setns(own)
    finally:
        os.close(own)
        os.close(target)
    return sock


def _pump(src: socket.socket, dst: socket.socket, done: threading.Semaphore) -> None:
    try:
        while True:
            data = src.recv(CHUNK)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        if not done.acquire(blocking=False):  # the second direction to end closes both
            src.close()
            dst.close()


class LoopbackRelay:
    def __init__(self, namespaces: list[str], ports: list[int]):
        self.namespaces, self.ports = list(namespaces), sorted(set(ports))
        self.listeners: list[socket.socket] = []
        self.stopped = threading.Event()

    def start(self) -> "LoopbackRelay":
        try:
            for ns in self.namespaces:
                for port in self.ports:
                    sock = _listen_in(ns, port)
                    self.listeners.append(sock)
                    threading.Thread(
                        target=self._accept, args=(sock, port), daemon=True, name=f"relay {ns}:{port}"
                    ).start()
        except BaseException:
            self.stop()
            raise
        return self

    def _accept(self, listener: socket.socket, port: int) -> None:
        while not self.stopped.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=self._connect, args=(conn, port), daemon=True).start()

    def _connect(self, conn: socket.socket, port: int) -> None:
        try:
            upstream = socket.create_connection(("127.0.0.1", port), timeout=10)
            upstream.settimeout(None)
        except OSError:
            conn.close()
            return
        for sock in (conn, upstream):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        done = threading.Semaphore(1)
        threading.Thread(target=_pump, args=(upstream, conn, done), daemon=True).start()
        _pump(conn, upstream, done)

    def stop(self) -> None:
        self.stopped.set()
        for sock in self.listeners:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked in accept()
            except OSError:
                pass
            try:
                sock.close()
            except OSError:
                pass
        self.listeners.clear()

    def __enter__(self) -> "LoopbackRelay":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
