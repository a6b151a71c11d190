"""One deadline for a whole outbound call: connect, send and read together.

Why: a socket timeout bounds each read, not the call. An answer that comes one byte at a time, each
byte inside the timeout, held a webhook attempt with a 1 s timeout for 6.9 s (a byte every 9 s would
hold it for days within the 64 KiB read limit), and a gateway call for as long: past the engine's
lease, which must exceed one call, so that a second worker took the step while the first still
talked to the gateway. Here every blocking socket operation of a call waits at most what is left of
the call's deadline (and never more than its own timeout); once the deadline has passed, the next
operation raises a timeout at once. A call therefore ends at most a few milliseconds past its
deadline, however the other side paces its bytes.

The deadline is the calling thread's (a :class:`contextvars.ContextVar`, set by :func:`bounded`), so a
kept-alive connection, reused by the next call, is bounded by that call's deadline. Two adapters apply
it, one per HTTP stack durapay uses:

* :class:`DeadlineSocket`, a socket wrapper for ``http.client`` (the webhook poster,
  ``workflows.webhooks.transport``): it sets the socket's timeout before every send and receive;
* :class:`DeadlineTransport`, an httpx transport for the gateway client (``_client``) whose network
  streams clamp every read, write, connect and TLS handshake the same way; :func:`deadline_mounts`
  gives the environment's proxies (``HTTPS_PROXY``, ``ALL_PROXY``, ``NO_PROXY``...) the same transport,
  so that a call through a proxy keeps its deadline (httpx applies them only without a transport of
  one's own: with this transport alone they were ignored and the gateway was called direct).

A name's resolution is bounded too (:func:`lookup`): ``getaddrinfo`` takes no timeout (the system
resolver's own can reach tens of seconds), so it runs on a thread of its own, at most
:data:`RESOLVER_THREADS` at once, and the call waits for it at most what is left of its deadline. A
resolver that hangs holds that thread until its own timeout, never the caller; both adapters connect to
the addresses it found.
"""

from __future__ import annotations

import contextlib
import contextvars
import io
import ipaddress
import os
import select
import socket
import ssl
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any

import httpcore
import httpx
from httpcore._backends.sync import SyncStream

#: The end (``time.monotonic``) of the call the current thread is making; None outside a bounded call.
_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar("durapay_call_deadline", default=None)


class DeadlinePassed(TimeoutError):
    """The call's deadline passed (a ``TimeoutError``: an OSError, as a socket timeout is)."""


@contextlib.contextmanager
def bounded(seconds: float) -> Iterator[float]:
    """Within the block, every socket operation of :class:`DeadlineSocket` and :class:`DeadlineTransport`
    ends by ``seconds`` from now (a nested block keeps the sooner end). Yields the end (monotonic)."""
    end = time.monotonic() + seconds
    outer = _DEADLINE.get()
    if outer is not None:
        end = min(end, outer)
    token = _DEADLINE.set(end)
    try:
        yield end
    finally:
        _DEADLINE.reset(token)


def clamp(timeout: float | None) -> float | None:
    """``timeout`` cut to what is left of the current call's deadline; raises :class:`DeadlinePassed`
    when nothing is left. Outside a bounded call, ``timeout`` as it is."""
    end = _DEADLINE.get()
    if end is None:
        return timeout
    left = end - time.monotonic()
    if left <= 0:
        raise DeadlinePassed("the call's deadline passed (connect, send and read together)")
    return left if timeout is None else min(timeout, left)


#: Names resolved at once for bounded calls (each holds a thread while the system resolver answers).
RESOLVER_THREADS = 8


class _Resolvers:
    """The slots names are resolved in, at most :data:`RESOLVER_THREADS` at once in a process (a name
    beyond them waits for a slot, within its deadline still). Each lookup runs on a daemon thread of its
    own, so that one the resolver never answers holds its slot until the resolver's own timeout, and
    neither its caller nor the process's exit. Counted anew in a forked child (its parent's lookups
    are not running there). Process-wide, as the system resolver is."""

    lock = threading.Lock()
    pid: int | None = None
    slots = threading.BoundedSemaphore(RESOLVER_THREADS)

    @classmethod
    def get(cls) -> threading.BoundedSemaphore:
        with cls.lock:
            if cls.pid != os.getpid():
                cls.slots = threading.BoundedSemaphore(RESOLVER_THREADS)
                cls.pid = os.getpid()
            return cls.slots


def _literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        return False
    return True


def lookup(host: str, port: int, family: int = 0, kind: int = socket.SOCK_STREAM, proto: int = 0) -> list[Any]:
    """``socket.getaddrinfo`` within what is left of the current call's deadline (:class:`DeadlinePassed`
    past it). An address written as one is not looked up; outside a bounded call, as getaddrinfo is."""
    if _literal(host) or _DEADLINE.get() is None:
        return socket.getaddrinfo(host, port, family, kind, proto)
    slots = _Resolvers.get()
    if not slots.acquire(timeout=clamp(None)):
        raise DeadlinePassed(f"resolving {host!r}: no resolver free within the call's deadline")
    answer: list[Any] = []
    failure: list[BaseException] = []
    done = threading.Event()

    def resolve() -> None:
        try:
            answer.extend(socket.getaddrinfo(host, port, family, kind, proto))
        except (OSError, ValueError) as exc:  # handed to the caller (it raises it), if it still waits
            failure.append(exc)
        finally:
            slots.release()
            done.set()

    threading.Thread(target=resolve, name="durapay-resolve", daemon=True).start()
    if not done.wait(clamp(None)):
        raise DeadlinePassed(f"resolving {host!r} did not end within the call's deadline")
    if failure:
        raise failure[0]
    return answer


def addresses(host: str, port: int) -> list[str]:
    """The addresses ``host`` resolves to for a TCP connection, in the resolver's order (:func:`lookup`)."""
    found: list[str] = []
    for info in lookup(host, port, proto=socket.IPPROTO_TCP):
        address = str(info[4][0])
        if address not in found:
            found.append(address)
    if not found:
        raise OSError(f"{host} has no address")
    return found


def tls_handshake(
    context: ssl.SSLContext, sock: socket.socket, server_hostname: str | None, timeout: float | None
) -> ssl.SSLSocket:
    """``sock`` wrapped in TLS, its handshake done within ``timeout`` and the call's deadline as a whole
    (a blocking handshake waits its timeout at each read: a server trickling its certificate held it)."""
    end = time.monotonic() + (timeout if timeout is not None else float("inf"))
    wrapped = context.wrap_socket(sock, server_hostname=server_hostname, do_handshake_on_connect=False)
    try:
        wrapped.settimeout(0.0)
        while True:
            try:
                wrapped.do_handshake()
                break
            except ssl.SSLWantReadError:
                readable, writable = [wrapped], []
            except ssl.SSLWantWriteError:
                readable, writable = [], [wrapped]
            left = clamp(end - time.monotonic())
            if left is None or left <= 0:
                raise DeadlinePassed("the TLS handshake did not end within its timeout")
            if not any(select.select(readable, writable, [], left)[:2]):
                raise DeadlinePassed("the TLS handshake did not end within its timeout")
    except BaseException:
        wrapped.close()
        raise
    wrapped.settimeout(timeout)
    return wrapped


class DeadlineSocket:
    """A connected socket (plain or TLS) whose every send and receive waits at most ``timeout`` and at
    most what is left of the current call's deadline. What ``http.client`` uses of a socket: send,
    sendall, recv, recv_into, makefile (its reader goes through this object), close; anything else is
    the socket's."""

    def __init__(self, sock: socket.socket, timeout: float | None) -> None:
        self._sock = sock
        self._timeout = timeout

    def _arm(self) -> None:
        self._sock.settimeout(clamp(self._timeout))

    def settimeout(self, timeout: float | None) -> None:
        self._timeout = timeout

    def gettimeout(self) -> float | None:
        return self._timeout

    def send(self, data: bytes | memoryview, flags: int = 0) -> int:
        self._arm()
        return self._sock.send(data, flags)

    def sendall(self, data: bytes | memoryview, flags: int = 0) -> None:
        view = memoryview(data)
        while view:
            sent = self.send(view, flags)  # each chunk within what is left, not the whole body in one wait
            view = view[sent:]

    def recv(self, size: int, flags: int = 0) -> bytes:
        self._arm()
        return self._sock.recv(size, flags)

    def recv_into(self, buffer: Any, size: int = 0, flags: int = 0) -> int:
        self._arm()
        return self._sock.recv_into(buffer, size, flags)

    def makefile(self, mode: str = "r", buffering: int | None = None, **_: Any) -> io.BufferedReader:
        if mode not in ("r", "rb"):
            raise ValueError(f"DeadlineSocket reads only (mode {mode!r})")
        raw = socket.SocketIO(self, "rb")  # type: ignore[arg-type] # reads through recv_into above
        return io.BufferedReader(raw, buffering or io.DEFAULT_BUFFER_SIZE)

    def _decref_socketios(self) -> None:  # socket.SocketIO's close asks for it
        pass

    def close(self) -> None:
        self._sock.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


class _Stream(httpcore.NetworkStream):
    """httpcore's network stream with every wait clamped to the call's deadline."""

    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, _clamped(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, _clamped(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self, ssl_context: ssl.SSLContext, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.NetworkStream:
        sock = self._inner.get_extra_info("socket")
        if not isinstance(sock, socket.socket) or isinstance(sock, ssl.SSLSocket):  # TLS in TLS: httpcore's own
            return _Stream(self._inner.start_tls(ssl_context, server_hostname, _clamped(timeout, httpcore.ConnectTimeout)))
        try:
            wrapped = tls_handshake(ssl_context, sock, server_hostname, _clamped(timeout, httpcore.ConnectTimeout))
        except TimeoutError as exc:
            self._inner.close()
            raise httpcore.ConnectTimeout(str(exc)) from None
        except OSError as exc:  # ssl.SSLError too: a certificate refused
            self._inner.close()
            raise httpcore.ConnectError(str(exc)) from None
        return _Stream(SyncStream(wrapped))

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


def _clamped(timeout: float | None, error: type[Exception]) -> float | None:
    try:
        return clamp(timeout)
    except DeadlinePassed as exc:
        raise error(str(exc)) from None


class _Backend(httpcore.NetworkBackend):
    """httpcore's synchronous backend, its streams and connects clamped to the call's deadline."""

    def __init__(self) -> None:
        self._inner = httpcore.SyncBackend()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        try:
            found = addresses(host, port)  # the name resolved within the deadline too
        except TimeoutError as exc:
            raise httpcore.ConnectTimeout(str(exc)) from None
        except OSError as exc:
            raise httpcore.ConnectError(str(exc)) from None
        failed: httpcore.ConnectError | None = None
        for address in found:  # as socket.create_connection does: each address in turn (TLS still names the host)
            limit = _clamped(timeout, httpcore.ConnectTimeout)
            try:
                return _Stream(self._inner.connect_tcp(address, port, limit, local_address, socket_options))
            except httpcore.ConnectError as exc:
                failed = exc
        assert failed is not None
        raise failed

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.NetworkStream:
        limit = _clamped(timeout, httpcore.ConnectTimeout)
        return _Stream(self._inner.connect_unix_socket(path, limit, socket_options))

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


class DeadlineTransport(httpx.HTTPTransport):
    """httpx's transport whose connections wait at most what is left of the call's deadline
    (:func:`bounded`) at every connect, TLS handshake, write and read."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        # httpx takes no network backend; its pool (a ConnectionPool, or a proxy's, a subclass) does.
        pool = self._pool
        assert hasattr(pool, "_network_backend"), "httpcore's pool keeps its backend as _network_backend"
        pool._network_backend = _Backend()


def deadline_mounts(**options: Any) -> dict[str, httpx.BaseTransport | None]:
    """httpx ``mounts`` for the proxies the environment names (``HTTP_PROXY``, ``HTTPS_PROXY``,
    ``ALL_PROXY``, ``NO_PROXY``: read as httpx reads them), each a :class:`DeadlineTransport` through
    that proxy; a host ``NO_PROXY`` exempts maps to None (the client's own transport, direct)."""
    from httpx._utils import get_environment_proxies  # httpx's own reading of them, not a second copy

    return {
        pattern: None if url is None else DeadlineTransport(proxy=httpx.Proxy(url), **options)
        for pattern, url in get_environment_proxies().items()
    }
