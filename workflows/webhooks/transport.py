"""The POST of a webhook attempt: ``http.client`` with one kept-alive connection per thread and host.

Why not httpx (the gateway client's): a webhook is one small POST whose answer is read for its status,
a header and a few bytes, and the worker makes two per flow; httpx spent about three times the CPU of
``http.client`` per request here (measured on the bench receiver), which showed in the flows' throughput.
Connections are per thread (a worker's threads pool) and per process (a fork makes new ones); a kept
connection the endpoint closed meanwhile is retried once on a new one, before any answer was read.

An attempt has one deadline, ``connect_timeout + timeout`` from its start, for connect, send and read
together (``durapay.gateway.bounded``): each socket operation waits at most what is left of it, so an
endpoint that trickles its answer a byte at a time holds a thread no longer than that (the timeouts alone
bound each read: a byte every 9 s would have held it for days within :data:`READ_LIMIT`).

A post may be given the ``address`` to connect to (the one ``endpoints.resolve_public`` checked): the
connection goes there and nowhere else, with the URL's host name sent as ``Host`` and used for TLS
(SNI and the certificate check), so that the name is never resolved a second time. Without one (private
addresses allowed: development and tests), the name is resolved here, within the deadline as well
(``durapay.gateway.addresses``: ``getaddrinfo`` itself takes no timeout), and connected to the same way.
"""

from __future__ import annotations

import http.client
import os
import ssl
import threading
from dataclasses import dataclass
from urllib.parse import urlsplit

from durapay.gateway import DeadlineSocket, addresses, bounded, clamp, tls_handshake

#: Bytes of an answer read at most (the rest is not read, and the connection is not kept).
READ_LIMIT = 64 * 1024


#: A kept connection's key: scheme, host name, port, the address it connects to (None: the name's).
Key = tuple[str, str, int | None, str | None]


class _PinnedHTTPS(http.client.HTTPSConnection):
    """TLS to a given address, checked for the host name (SNI and certificate), not for the address."""

    def __init__(self, address: str, port: int | None, server_name: str, *, timeout: float, context: ssl.SSLContext) -> None:
        super().__init__(address, port, timeout=timeout, context=context)
        self.server_name = server_name

    def connect(self) -> None:
        http.client.HTTPConnection.connect(self)
        # The handshake as a whole within the connect timeout and the attempt's deadline.
        self.sock = tls_handshake(self._context, self.sock, self.server_name, self.timeout)  # type: ignore[attr-defined]


@dataclass(frozen=True)
class Answer:
    status: int
    retry_after: str | None
    text: str


class Poster:
    def __init__(self, *, timeout: float, connect_timeout: float) -> None:
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        #: The longest one attempt may take, from its connect to its answer's last byte read.
        self.deadline = connect_timeout + timeout
        self._local = threading.local()
        self._tls = ssl.create_default_context()

    def post(self, url: str, body: bytes, headers: dict[str, str], *, excerpt: int, address: str | None = None) -> Answer:
        """POST ``body`` to ``url`` (connecting to ``address`` when given), all of it within
        :attr:`deadline`; raises OSError (TimeoutError past the deadline) or http.client.HTTPException
        when no answer came."""
        with bounded(self.deadline):
            return self._post(url, body, headers, excerpt=excerpt, address=address)

    def _post(self, url: str, body: bytes, headers: dict[str, str], *, excerpt: int, address: str | None) -> Answer:
        parts = urlsplit(url)
        key = (parts.scheme, parts.hostname or "", parts.port, address)
        # The connection goes to an address (the one checked, or the one resolved here): the name is sent.
        headers = {**headers, "Host": parts.netloc.rpartition("@")[2]}
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        for fresh in (False, True):
            connection, reused = self._connection(key, fresh)
            try:
                connection.request("POST", path, body=body, headers=headers)
                response = connection.getresponse()
            except (OSError, http.client.HTTPException):
                self._drop(key)
                if reused and not fresh:
                    continue  # the endpoint closed a kept connection meanwhile: once more on a new one
                raise
            try:
                data = response.read(READ_LIMIT)
            except (OSError, http.client.HTTPException):
                self._drop(key)  # cut mid-answer (its deadline): the connection is in no state to reuse
                raise
            if not response.isclosed() or response.will_close:
                self._drop(key)  # more than we read, or the server closes: do not keep it
            return Answer(response.status, response.getheader("retry-after"), data[:excerpt].decode("utf-8", "replace"))
        raise AssertionError("unreachable")

    def _connection(self, key: Key, fresh: bool) -> tuple[http.client.HTTPConnection, bool]:
        pool = self._pool()
        held = pool.get(key)
        if held is not None and not fresh:
            return held, True
        self._drop(key)
        scheme, host, port, address = key
        # Resolved within the attempt's deadline (http.client would call getaddrinfo, which waits as long
        # as the system resolver does), each address tried in turn as socket.create_connection does.
        targets = [address] if address else addresses(host, port or (443 if scheme == "https" else 80))
        connection = self._connect(scheme, host, port, targets)
        if connection.sock is not None:
            # Every later send and read waits at most what is left of the attempt's deadline.
            connection.sock = DeadlineSocket(connection.sock, self.timeout)
        pool[key] = connection
        return connection, False

    def _connect(self, scheme: str, host: str, port: int | None, targets: list[str]) -> http.client.HTTPConnection:
        failed: OSError | None = None
        for target in targets:
            connection: http.client.HTTPConnection
            if scheme == "https":
                connection = _PinnedHTTPS(target, port, host, timeout=self._connect_limit(), context=self._tls)
            else:
                connection = http.client.HTTPConnection(target, port, timeout=self._connect_limit())
            try:
                connection.connect()
            except ssl.SSLError:
                connection.close()
                raise  # the endpoint answered: its certificate or its TLS is wrong, another address would not say otherwise
            except OSError as exc:
                connection.close()
                failed = exc
                continue
            return connection
        assert failed is not None
        raise failed

    def _connect_limit(self) -> float:
        """The connect timeout, cut to what is left of the attempt's deadline (TLS's handshake too)."""
        return clamp(self.connect_timeout) or self.connect_timeout

    def _pool(self) -> dict[Key, http.client.HTTPConnection]:
        if getattr(self._local, "pid", None) != os.getpid():
            self._local.pid = os.getpid()
            self._local.pool = {}
        pool: dict[Key, http.client.HTTPConnection] = self._local.pool
        return pool

    def _drop(self, key: Key) -> None:
        held = self._pool().pop(key, None)
        if held is not None:
            held.close()
