"""Hostile HTTP endpoints on loopback, for the outbound deadline's tests and the isolation benchmark.

A :class:`SlowReceiver` accepts connections on its own port, reads each request, and then, by its mode:

* ``trickle``: sends a status line and headers at once, then the body one byte every ``every`` seconds
  (``length`` bytes in all), so that no single read ever waits long;
* ``silent``: never answers (the connection stays open until the client gives up or the server stops).

It counts the connections it is holding (:attr:`held`), those the client gave up on before the body was
sent whole (:attr:`cut`), and those it finished (:attr:`finished`). Each connection is served by a thread
of its own, at most :data:`MAX_CONNECTIONS` at once (beyond that a connection is closed unanswered).
:meth:`release` ends every held connection at once (tests release before they stop).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from types import TracebackType

#: Connections served at once; more are closed at once (a bound on the server's threads).
MAX_CONNECTIONS = 64


class SlowReceiver:
    def __init__(self, mode: str = "trickle", *, every: float = 0.2, length: int = 10_000, port: int = 0) -> None:
        if mode not in ("trickle", "silent"):
            raise ValueError(f"mode: trickle or silent, not {mode!r}")
        self.mode, self.every, self.length = mode, every, length
        self._listener = socket.create_server(("127.0.0.1", port))
        self._listener.settimeout(0.2)
        self.port = self._listener.getsockname()[1]
        self._released = threading.Event()
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self.held = 0
        self.cut = 0
        self.finished = 0
        self.requests = 0
        self._threads: list[threading.Thread] = []
        self._accept = threading.Thread(target=self._serve, name=f"slow-{mode}", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def __enter__(self) -> SlowReceiver:
        self._accept.start()
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.stop()

    def release(self) -> None:
        """End every connection held now and from now on (silent ones are closed, trickles cut short)."""
        self._released.set()

    def stop(self) -> None:
        self._released.set()
        self._stopped.set()
        self._accept.join(timeout=5)
        for thread in list(self._threads):
            thread.join(timeout=5)
        self._listener.close()

    def _serve(self) -> None:
        while not self._stopped.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self._threads = [thread for thread in self._threads if thread.is_alive()]
            if len(self._threads) >= MAX_CONNECTIONS:
                conn.close()
                continue
            thread = threading.Thread(target=self._one, args=(conn,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _count(self, name: str, step: int = 1) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + step)

    def _read_request(self, conn: socket.socket) -> bool:
        conn.settimeout(5)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return False
            data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value.strip())
        while len(rest) < length:
            chunk = conn.recv(65536)
            if not chunk:
                return False
            rest += chunk
        return True

    def _one(self, conn: socket.socket) -> None:
        with contextlib.closing(conn):
            try:
                if not self._read_request(conn):
                    return
            except OSError:
                return
            self._count("requests")
            self._count("held")
            try:
                if self.mode == "silent":
                    self._hold_silent(conn)
                else:
                    self._trickle(conn)
            finally:
                self._count("held", -1)

    def _hold_silent(self, conn: socket.socket) -> None:
        conn.settimeout(self.every)
        while not self._released.is_set():
            try:
                if not conn.recv(1):  # the client closed: it gave up
                    self._count("cut")
                    return
            except TimeoutError:
                continue
            except OSError:
                self._count("cut")
                return

    def _trickle(self, conn: socket.socket) -> None:
        head = f"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {self.length}\r\n\r\n".encode()
        try:
            conn.sendall(head)
            for _ in range(self.length):
                if self._released.wait(self.every):
                    return
                conn.sendall(b"x")
        except OSError:  # the client closed: it gave up before the body ended
            self._count("cut")
            return
        self._count("finished")
