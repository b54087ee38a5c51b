"""One streamed HTTP/1.1 POST to a model endpoint, on asyncio streams with h11 (the HTTP/1.1
state machine httpx itself runs on, through httpcore).

Why not httpx for every model call: a model call is a run's largest piece of work in the
worker when the model answers at once, and httpx's layers around one request (its client,
cookies through ``urllib.request``, httpcore's pool, anyio) cost more than the request
itself (issue 14: a streamed call of 36 lines took ~1.6 ms of CPU over httpx, ~0.7 ms
here). ``llm.client`` still uses httpx for an endpoint that an environment proxy applies
to (``proxied``): the proxies, their authentication and tunnels are httpx's to get right,
not ours.

What this does, and all it does: 1. the connection: a kept one to the same origin if this
event loop keeps connections (``Pool``, one per long-lived loop) and one is idle and still
open, else a new one (TCP, TLS with the caller's context for ``https``), within the connect
timeout; 2. the request: ``POST`` with ``Host``, ``Content-Length`` and the caller's
headers, the body in one write; the response's head within the read timeout; 3. the body:
read as it comes, each read within the read timeout, split into lines (``Response.lines``);
4. afterwards: a connection whose response was read to its end goes back to the pool, any
other is closed. An idle connection is kept ``KEEPALIVE_SECONDS`` at most (httpx's 5 s: a
connection a NAT or load balancer dropped silently would otherwise hold the next call for
its whole read timeout), ``IDLE_PER_ORIGIN`` of them at most. A kept connection found closed
by the server (its keep-alive ran out), or failing while the request is written, is
replaced by a new one and the request sent there; once the whole request was written it is
never sent again (the endpoint may be working on it: a second would be a second, billed
call). Every failure is a ``StreamError``: ``StreamTimeout`` for a timeout,
``StreamBroken`` for the rest (refused, reset, TLS, a request h11 refuses to write, a
response that is not HTTP/1.1).

Replaces: httpx (with httpcore and anyio) for a model call's streamed POST; ``llm.client``
calls it by name (docs/decisions/2026-12-03-model-calls-over-h11.md). Drop it when httpx's
own CPU per streamed request comes near a bare h11 exchange (the figures above);
``llm.client`` then calls httpx for every endpoint. Tests: tests/llm/test_brain_client_loops.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import urllib.request
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import NamedTuple, TypeVar
from urllib.parse import quote, urlsplit

import h11

READ_SIZE = 65536
KEEPALIVE_SECONDS = 5.0  # an idle kept connection older than this is closed, not used
IDLE_PER_ORIGIN = 8
# A host name that resolves to several addresses: the next one is tried after this long
# (RFC 8305's "happy eyeballs"), not after the whole connect timeout.
HAPPY_EYEBALLS_SECONDS = 0.25
T = TypeVar("T")
USER_AGENT = "yimi"


_TARGET_SAFE = "/%:@!$&'()*+,;=-._~"


class StreamError(Exception):
    pass


class StreamTimeout(StreamError):
    pass


class StreamBroken(StreamError):
    pass


class Origin(NamedTuple):
    scheme: str
    host: str
    port: int


@dataclass(frozen=True)
class Timeouts:
    connect: float
    read: float  # each read, each write and the response's head


def proxied(url: str) -> bool:
    """Whether an environment proxy (``HTTP_PROXY``, ``HTTPS_PROXY``, ``ALL_PROXY``, not
    bypassed by ``NO_PROXY``) applies to ``url``: httpx's ``trust_env`` would use it."""
    proxies = urllib.request.getproxies_environment()
    if not proxies:
        return False
    parts = urlsplit(url)
    if not (proxies.get(parts.scheme) or proxies.get("all")):
        return False
    return not urllib.request.proxy_bypass_environment(parts.hostname or "", proxies)


def _split(url: str) -> tuple[Origin, str, str]:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise StreamBroken(f"not an http(s) URL: {url!r}")
    default = 443 if parts.scheme == "https" else 80
    try:
        port = parts.port or default
    except ValueError:
        raise StreamBroken(f"not an http(s) URL: {url!r}") from None
    host = parts.hostname
    authority = f"[{host}]" if ":" in host else host
    if port != default:
        authority += f":{port}"
    # Characters a request target may not hold (a space, non-ASCII) percent-encoded, as
    # httpx did; what is already encoded stays as it is.
    target = quote(parts.path or "/", safe=_TARGET_SAFE) + (f"?{quote(parts.query, safe=_TARGET_SAFE + '?')}" if parts.query else "")
    return Origin(parts.scheme, host, port), authority, target


class _Connection:
    def __init__(self, origin: Origin, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.origin = origin
        self.reader = reader
        self.writer = writer
        self.h11 = h11.Connection(h11.CLIENT)
        self.idle_since = 0.0  # the event loop's time it went back to the pool

    def idle_and_open(self) -> bool:
        return self.h11.our_state is h11.IDLE and not self.writer.is_closing() and not self.reader.at_eof()

    def reusable(self) -> bool:
        if self.h11.our_state is h11.DONE and self.h11.their_state is h11.DONE and not self.writer.is_closing():
            self.h11.start_next_cycle()
            return True
        return False

    def close(self) -> None:
        self.writer.transport.abort()

    async def send(self, request: h11.Request, body: bytes, timeout: float) -> None:
        data = self.h11.send(request) + self.h11.send(h11.Data(data=body)) + self.h11.send(h11.EndOfMessage())
        self.writer.write(data)
        async with asyncio.timeout(timeout):
            await self.writer.drain()

    async def next_event(self, timeout: float) -> object:
        while True:
            event = self.h11.next_event()
            if event is not h11.NEED_DATA:
                return event  # type: ignore[return-value]
            async with asyncio.timeout(timeout):
                data = await self.reader.read(READ_SIZE)
            self.h11.receive_data(data)  # b"": the server closed the connection


class Response:
    def __init__(self, connection: _Connection, status: int, timeouts: Timeouts) -> None:
        self.status = status
        self._connection = connection
        self._timeouts = timeouts

    async def lines(self) -> AsyncIterator[str]:
        """The body as text lines (UTF-8, without their line ends), as they arrive."""
        pending = b""
        connection, timeout = self._connection, self._timeouts.read
        while True:
            try:
                event = await connection.next_event(timeout)
            except TimeoutError:
                raise StreamTimeout("no answer within the timeout") from None
            except _BROKEN as exc:
                raise StreamBroken(type(exc).__name__) from None
            if isinstance(event, h11.Data):
                pending += event.data
                if b"\r" in pending:  # SSE ends a line with CRLF, LF or CR (a CRLF cut in two: one empty line more)
                    pending = pending.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
                if b"\n" in pending:
                    *complete, pending = pending.split(b"\n")
                    for line in complete:
                        yield line.decode("utf-8", "replace")
            elif isinstance(event, h11.EndOfMessage):
                if pending:
                    yield pending.decode("utf-8", "replace")
                return


_BROKEN = (OSError, EOFError, h11.ProtocolError)  # OSError includes ssl.SSLError and refused/reset


async def _guarded(step: Awaitable[T]) -> T:
    """``step``'s result, its failures as ``StreamError``."""
    try:
        return await step
    except TimeoutError:
        raise StreamTimeout("no answer within the timeout") from None
    except _BROKEN as exc:
        raise StreamBroken(type(exc).__name__) from None


class Pool:
    """The idle kept connections of one long-lived event loop, by origin."""

    def __init__(self, clock: Callable[[], float] | None = None) -> None:
        self._idle: dict[Origin, list[_Connection]] = {}
        self._proxied: dict[str, bool] = {}
        self.clock = clock or (lambda: asyncio.get_running_loop().time())

    def proxy_applies(self, url: str) -> bool:
        """``proxied(url)``, read once per URL for this loop, as httpx read the environment
        once when its kept client was made (reading it costs ~60 µs: every variable of the
        environment, on every call)."""
        applies = self._proxied.get(url)
        if applies is None:
            applies = self._proxied[url] = proxied(url)
        return applies

    def take(self, origin: Origin) -> _Connection | None:
        """The most recently used idle connection to ``origin`` that is still open and
        younger than ``KEEPALIVE_SECONDS``; the others of that origin past it are closed."""
        idle = self._idle.get(origin)
        if not idle:
            return None
        expired_before = self.clock() - KEEPALIVE_SECONDS
        while idle:
            connection = idle.pop()
            if connection.idle_since >= expired_before and connection.idle_and_open():
                return connection
            connection.close()
        return None

    def give_back(self, connection: _Connection) -> None:
        connection.idle_since = self.clock()
        idle = self._idle.setdefault(connection.origin, [])
        idle.append(connection)
        while len(idle) > IDLE_PER_ORIGIN:
            idle.pop(0).close()  # the longest idle

    def idle(self) -> int:
        return sum(len(c) for c in self._idle.values())

    def close(self) -> None:
        for connections in self._idle.values():
            for connection in connections:
                connection.close()
        self._idle.clear()


_pools: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Pool] = weakref.WeakKeyDictionary()


def keep_connections_on(loop: asyncio.AbstractEventLoop) -> Pool:
    """``loop`` lives as long as its process: its calls keep their connections open."""
    pool = _pools.get(loop)
    if pool is None:
        pool = _pools[loop] = Pool()
    return pool


def pool_of(loop: asyncio.AbstractEventLoop) -> Pool | None:
    return _pools.get(loop)


async def _connect(origin: Origin, timeouts: Timeouts, tls: ssl.SSLContext) -> _Connection:
    secure = origin.scheme == "https"
    async with asyncio.timeout(timeouts.connect):
        reader, writer = await asyncio.open_connection(
            origin.host, origin.port, ssl=tls if secure else None, server_hostname=origin.host if secure else None,
            limit=READ_SIZE, happy_eyeballs_delay=HAPPY_EYEBALLS_SECONDS,
        )
    return _Connection(origin, reader, writer)


@contextlib.asynccontextmanager
async def post(url: str, body: bytes, headers: dict[str, str], timeouts: Timeouts, tls: ssl.SSLContext) -> AsyncIterator[Response]:
    """``POST url`` with ``body``: the response, its head read, its body to be read with
    ``Response.lines`` inside the ``async with``."""
    origin, authority, target = _split(url)
    try:
        request = h11.Request(
            method="POST", target=target,
            headers=[("Host", authority), ("User-Agent", USER_AGENT), ("Content-Length", str(len(body))), *headers.items()],
        )
    except h11.LocalProtocolError as exc:  # a header value with a line break, say
        raise StreamBroken(f"the request cannot be written ({exc})") from None
    pool = _pools.get(asyncio.get_running_loop())
    connection = pool.take(origin) if pool is not None else None
    try:
        if connection is not None:
            try:
                await _guarded(connection.send(request, body, timeouts.read))
            except StreamBroken:
                # Closed while idle, seen as the request was written: the request is sent
                # on a new connection. Once it was written whole, it is never sent again.
                connection.close()
                connection = None
        if connection is None:
            connection = await _guarded(_connect(origin, timeouts, tls))
            await _guarded(connection.send(request, body, timeouts.read))
        status = await _guarded(_response_head(connection, timeouts))
        yield Response(connection, status, timeouts)
    finally:
        if connection is not None:
            if pool is not None and connection.reusable():
                pool.give_back(connection)
            else:
                connection.close()


async def _response_head(connection: _Connection, timeouts: Timeouts) -> int:
    while True:
        event = await connection.next_event(timeouts.read)
        if isinstance(event, h11.InformationalResponse):
            continue  # 100 Continue and the like: the real response follows
        if isinstance(event, h11.Response):
            return int(event.status_code)
        raise StreamBroken(f"unexpected {type(event).__name__} before the response")
