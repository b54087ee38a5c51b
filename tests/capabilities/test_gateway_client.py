"""The platform's gateway client and the packs' platform client keep their connections:
sequential operations from one event loop (or one pack process) reuse one connection over
the internal Unix socket, a new loop gets a client of its own, and a client is closed on
its own loop when that loop ends, never from another one."""

from __future__ import annotations

import asyncio
import gc
import json
import socket
import socketserver
import tempfile
import threading
import warnings
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest

from capabilities import packkit
from capabilities.client import HttpTransport, http_clients


class KeepAliveServer:
    """An HTTP/1.1 server with keep-alive on a Unix socket that counts the connections it
    accepts and answers every POST with ``{"decision": "allow", "path": ...}``."""

    def __init__(self, path: Path) -> None:
        counter = self
        self.accepted = 0
        self.requests: list[tuple[str, dict[str, str]]] = []
        self._lock = threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                with counter._lock:
                    counter.accepted += 1
                super().setup()

            def address_string(self) -> str:
                return "unix"

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                self.rfile.read(length)
                with counter._lock:
                    counter.requests.append((self.path, dict(self.headers)))
                body = json.dumps({"decision": "allow", "path": self.path}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
            daemon_threads = True

        path.unlink(missing_ok=True)
        self.path = path
        self.server = Server(str(path), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, name="keep-alive-server", daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.path.unlink(missing_ok=True)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[KeepAliveServer]:
    # A short path: a Unix socket's path is limited to about 100 bytes.
    directory = Path(tempfile.mkdtemp(prefix="yimi-ka-", dir="/tmp"))
    running = KeepAliveServer(directory / "s.sock")
    try:
        yield running
    finally:
        running.close()
        directory.rmdir()


def test_sequential_operations_from_one_loop_share_one_connection_and_a_new_loop_gets_a_new_client(
    server: KeepAliveServer, settings: Any
) -> None:
    settings.INTERNAL_TOKEN = "token-for-the-test"
    gateway = HttpTransport(str(server.path))
    clients: list[Any] = []

    async def three_operations() -> None:
        assert (await gateway.decide({"tool": "demo__read"}))["path"] == "/internal/gateway/decide/"
        assert (await gateway.receipt({"call_id": "c"}))["path"] == "/internal/gateway/receipt/"
        await gateway.observe({"call_id": "c"})
        clients.append(await http_clients.get(str(server.path)))

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        asyncio.run(three_operations())
        assert server.accepted == 1
        assert [path for path, _ in server.requests] == [
            "/internal/gateway/decide/", "/internal/gateway/receipt/", "/internal/gateway/observe/"
        ]
        assert all(headers["X-Yimi-Internal-Token"] == "token-for-the-test" for _, headers in server.requests)
        assert clients[0].is_closed  # closed on its own loop when asyncio.run ended

        asyncio.run(three_operations())
        assert server.accepted == 2  # the second loop's client opened its own connection
        assert clients[1] is not clients[0] and clients[1].is_closed
        assert http_clients.count() == 0

        # A loop closed without shutting its async generators down: its client is left to
        # be discarded, and the next loop neither uses nor closes it from the wrong loop.
        bare = asyncio.new_event_loop()
        bare.run_until_complete(three_operations())
        bare.close()
        assert server.accepted == 3 and not clients[2].is_closed
        asyncio.run(three_operations())
        assert server.accepted == 4 and clients[3] is not clients[2]
        clients.clear()
        gc.collect()
    assert not [w for w in caught if "Event loop is closed" in str(w.message) or "was never awaited" in str(w.message)]
    assert http_clients.count() == 0


def test_concurrent_operations_on_one_loop_share_the_loops_client(server: KeepAliveServer) -> None:
    gateway = HttpTransport(str(server.path))

    async def both() -> tuple[Any, Any]:
        await asyncio.gather(gateway.decide({}), gateway.decide({}))
        first = await http_clients.get(str(server.path))
        await gateway.decide({})
        return first, await http_clients.get(str(server.path))

    first, second = asyncio.run(both())
    assert first is second
    assert 1 <= server.accepted <= 2  # two at once may need two connections; the third reuses one
    assert len(server.requests) == 3


def test_a_pack_process_reuses_its_connection_to_the_platform(server: KeepAliveServer, monkeypatch: Any) -> None:
    monkeypatch.setenv("YIMI_PLATFORM_SOCKET", str(server.path))
    packkit.close_platform_connections()

    def handler(args: dict[str, Any]) -> list[tuple[int, Any]]:
        return [packkit.platform_call("POST", "memory/commit/", {"n": n}) for n in range(3)]

    try:
        answers = packkit.run_with_capability(handler, {}, "cap-1")
        assert [status for status, _ in answers] == [200, 200, 200]
        assert answers[0][1]["path"] == "/internal/memory/commit/"
        assert server.accepted == 1
        # Another handler thread takes the idle connection too.
        worker = threading.Thread(target=packkit.run_with_capability, args=(handler, {}, "cap-2"))
        worker.start()
        worker.join(10)
        assert server.accepted == 1
        assert [headers["X-Yimi-Call-Capability"] for _, headers in server.requests] == ["cap-1"] * 3 + ["cap-2"] * 3
    finally:
        packkit.close_platform_connections()


def test_a_connection_the_platform_closed_while_idle_is_not_reused(server: KeepAliveServer, monkeypatch: Any) -> None:
    monkeypatch.setenv("YIMI_PLATFORM_SOCKET", str(server.path))
    packkit.close_platform_connections()
    try:
        assert packkit.run_with_capability(lambda _a: packkit.platform_call("POST", "x/", {}), {}, "cap")[0] == 200
        idle = packkit._idle[str(server.path)][0]
        assert idle.sock is not None
        idle.sock.shutdown(socket.SHUT_RD)  # reads as end-of-file, as a socket the server closed does
        assert packkit.run_with_capability(lambda _a: packkit.platform_call("POST", "x/", {}), {}, "cap")[0] == 200
        assert server.accepted == 2
    finally:
        packkit.close_platform_connections()
