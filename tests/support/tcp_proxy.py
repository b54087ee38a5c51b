"""A TCP proxy the test controls, in front of a real server (Redis, PostgreSQL): an outage
on demand.

It forwards every connection to the server until ``drop()`` ends them all and stops
listening, so new connections are refused as by a server that is down; ``accept()``
listens again on the same port. ``drop(reset=True)`` ends them with a reset (RST: a proxy,
a NAT or a host that lost them) instead of a close (FIN: a server that stopped). It runs an
event loop of its own on a thread, so sync tests, async tests on their own loops and the
processes the tests start reach it alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
from collections.abc import Coroutine
from typing import Any
from urllib.parse import urlsplit, urlunsplit


class TcpProxy:
    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.port = 0  # the proxy's own, picked by the OS at the first listen and kept
        self._server: asyncio.Server | None = None
        self._ends: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.accepted = 0  # connections forwarded, all told
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tcp-proxy", daemon=True)
        self._thread.start()
        self._call(self._listen())

    @classmethod
    def before(cls, url: str) -> TcpProxy:
        """A proxy in front of the server of ``url`` (``redis://…``, ``postgres://…``)."""
        parts = urlsplit(url)
        return cls(parts.hostname or "127.0.0.1", parts.port or {"redis": 6379}.get(parts.scheme, 5432))

    def url(self, url: str) -> str:
        """``url`` with the proxy's address in place of the server's."""
        parts = urlsplit(url)
        credentials = parts.netloc.rpartition("@")[0]
        return urlunsplit(parts._replace(netloc=f"{credentials + '@' if credentials else ''}127.0.0.1:{self.port}"))

    def drop(self, *, reset: bool = False) -> None:
        """End every connection (closed, or reset with ``reset``) and refuse new ones."""
        self._call(self._drop(reset))

    def accept(self) -> None:
        """Listen again, on the same port."""
        self._call(self._listen())

    def close(self) -> None:
        self.drop()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)
        self._loop.close()

    def __enter__(self) -> TcpProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, coroutine: Coroutine[Any, Any, None]) -> None:
        asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(30)

    async def _listen(self) -> None:
        if self._server is None:
            self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port, reuse_address=True)
            self.port = self._server.sockets[0].getsockname()[1]

    async def _drop(self, reset: bool) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for ends in list(self._ends):
            for writer in ends:
                sock = writer.get_extra_info("socket")
                if reset and sock is not None:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                writer.transport.abort()
        self._ends.clear()
        # Until every connection's sockets are closed: the client's kernel has the FIN or RST.
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            try:
                upstream_reader, upstream_writer = await asyncio.open_connection(*self.target)
            except OSError:
                writer.transport.abort()
                return
            self.accepted += 1
            ends = (writer, upstream_writer)
            self._ends.add(ends)
            await asyncio.gather(self._pipe(reader, upstream_writer), self._pipe(upstream_reader, writer))
            self._ends.discard(ends)
        finally:
            self._tasks.discard(task)

    @staticmethod
    async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while data := await source.read(65536):
                sink.write(data)
                await sink.drain()
        sink.close()
