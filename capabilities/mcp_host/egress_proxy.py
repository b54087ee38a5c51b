"""The egress proxy of one pack host: the sandbox's only way out, and only to what it declared.

    YIMI_EGRESS_RULES='{"pack": ..., "rules": [...], "hosts": {...}}' \\
        python -m capabilities.mcp_host.egress_proxy --socket PATH -- bwrap ...

A pack host that declares egress runs in a sandbox with no network at all (bubblewrap's
``--unshare-all``: a network namespace with only its own loopback). This process runs
outside it, as the sandbox's parent: it serves a forward proxy on the Unix socket
``PATH`` (its directory is bound into the sandbox), starts the command (bubblewrap), and
when the command ends removes the socket and exits with its status. The rules come in
``YIMI_EGRESS_RULES``, which is removed before the command starts. Every connection is
decided by ``capabilities.egress.Policy`` (host, port and protocol declared; the name
resolved here, never by the pack; every address public or named by the declaration):

- ``CONNECT host:port HTTP/1.1``: a TCP tunnel (HTTPS, or any TCP protocol a pack speaks
  through ``packkit.egress_connection``);
- ``CONNECT host:port HTTP/1.1`` with ``Yimi-Egress-Protocol: udp``: a UDP association;
  after the 200 answer each datagram is a 2-byte big-endian length and its bytes, both ways;
- ``GET http://host[:port]/path HTTP/1.1`` (any method, absolute URI): one plain HTTP
  request, sent with ``Host`` set to the checked authority and ``Connection: close``; the
  response is relayed with ``Connection: close``, so a client never sends a second
  request (perhaps for another host) on the same connection.

A refusal is an HTTP response before anything reaches the destination: 403 for
``egress_not_declared`` and ``egress_address_refused``, 502 for ``egress_unresolved`` and
``egress_unreachable``, 400 for ``egress_bad_request``; the code is in the
``Yimi-Egress-Refused`` header and starts the body. A plain request whose declared server
does not resolve or answer gets no response at all: the connection closes, as a direct one
would have failed. Each refusal is logged as a JSON line
(``pack_egress_refused``) on stderr, the pack host's log.

The standard library only: it starts with every pack host that declares egress.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import json
import os
import signal
import struct
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from capabilities.egress import (
    ADDRESS_REFUSED,
    BAD_REQUEST,
    NOT_DECLARED,
    UNREACHABLE,
    UNRESOLVED,
    EgressRefused,
    IPAddress,
    Policy,
)

RULES_ENV = "YIMI_EGRESS_RULES"
PROTOCOL_HEADER = "yimi-egress-protocol"
REFUSED_HEADER = "Yimi-Egress-Refused"
MAX_HEAD_BYTES = 64 * 1024
HEAD_TIMEOUT_SECONDS = 30.0
CONNECT_TIMEOUT_SECONDS = 10.0
UDP_IDLE_SECONDS = 120.0
STATUS = {NOT_DECLARED: 403, ADDRESS_REFUSED: 403, UNRESOLVED: 502, UNREACHABLE: 502, BAD_REQUEST: 400}
REASONS = {400: "Bad Request", 403: "Forbidden", 502: "Bad Gateway"}
HOP_BY_HOP = {"connection", "proxy-connection", "keep-alive", "proxy-authorization", "proxy-authenticate", "te", "trailer", "upgrade", "host"}


def log(event: str, **fields: Any) -> None:
    print(json.dumps({"ts": round(time.time(), 3), "event": event, **fields}, ensure_ascii=False), file=sys.stderr, flush=True)


class Head:
    """A parsed request or response head: the first line's three parts and the headers."""

    def __init__(self, raw: bytes) -> None:
        lines = raw.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) == 2 and parts[0].startswith("HTTP/"):
            parts.append("")  # a status line without a reason phrase
        if len(parts) != 3:
            raise EgressRefused(BAD_REQUEST, "the first line is not METHOD TARGET VERSION")
        self.first = parts
        self.headers: list[tuple[str, str]] = []
        for line in lines[1:]:
            if not line:
                continue
            name, sep, value = line.partition(":")
            if not sep or not name.strip():
                raise EgressRefused(BAD_REQUEST, "a header line has no name")
            self.headers.append((name.strip(), value.strip()))

    def get(self, name: str) -> str:
        return next((v for k, v in self.headers if k.lower() == name), "")

    def without(self, names: set[str]) -> list[tuple[str, str]]:
        dropped = names | {token.strip().lower() for token in self.get("connection").split(",") if token.strip()}
        return [(k, v) for k, v in self.headers if k.lower() not in dropped]


def render(first: str, headers: list[tuple[str, str]]) -> bytes:
    return (first + "\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers) + "\r\n").encode("latin-1")


async def read_head(reader: asyncio.StreamReader) -> bytes:
    try:
        return await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT_SECONDS)
    except asyncio.LimitOverrunError:
        raise EgressRefused(BAD_REQUEST, f"the head is longer than {MAX_HEAD_BYTES} bytes") from None
    except (asyncio.IncompleteReadError, TimeoutError):
        raise EgressRefused(BAD_REQUEST, "the head did not arrive") from None


def split_authority(authority: str) -> tuple[str, int]:
    host, sep, port = authority.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise EgressRefused(BAD_REQUEST, f"{authority!r} is not host:port")
    return host, int(port)


async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy until end of stream, then half-close the other side."""
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(OSError, RuntimeError):
            if writer.can_write_eof():
                writer.write_eof()


class EgressProxy:
    def __init__(self, policy: Policy, pack: str = "") -> None:
        self.policy, self.pack = policy, pack

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        destination: dict[str, Any] = {}
        plain = False
        try:
            head = Head(await read_head(reader))
            method, target, version = head.first
            if method.upper() == "CONNECT":
                host, port = split_authority(target)
                protocol = head.get(PROTOCOL_HEADER).lower() or "tcp"
                destination = {"host": host, "port": port, "protocol": protocol}
                addresses = await self.decide(host, port, protocol)
                if protocol == "udp":
                    await self.associate(reader, writer, addresses, port)
                else:
                    up_reader, up_writer = await self.open(addresses, port)
                    writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
                    await self.relay(reader, writer, up_reader, up_writer)
            else:
                plain = True
                url = urlsplit(target)
                if url.scheme != "http" or not url.hostname:
                    raise EgressRefused(BAD_REQUEST, "a plain request names an absolute http:// URL (HTTPS goes through CONNECT)")
                host, port = url.hostname, url.port or 80
                destination = {"host": host, "port": port, "protocol": "tcp"}
                addresses = await self.decide(host, port, "tcp")
                up_reader, up_writer = await self.open(addresses, port)
                path = (url.path or "/") + (f"?{url.query}" if url.query else "")
                headers = [*head.without(HOP_BY_HOP), ("Host", url.netloc.rpartition("@")[2]), ("Connection", "close")]
                up_writer.write(render(f"{method} {path} {version}", headers))
                await self.relay(reader, writer, up_reader, up_writer, rewrite_response=True)
        except EgressRefused as exc:
            log("pack_egress_refused", pack=self.pack, code=exc.code, message=exc.message, **destination)
            if not (plain and exc.code in (UNREACHABLE, UNRESOLVED)):
                await self.refuse(writer, exc)
            # else closed without an answer: to the pack's HTTP client a declared server that
            # cannot be reached is a connection that failed, as without a proxy, never a
            # response (a 502 would read as the server's own answer)
        except (ConnectionError, OSError):
            pass
        finally:
            with contextlib.suppress(OSError, RuntimeError):
                writer.close()

    async def decide(self, host: str, port: int, protocol: str) -> list[IPAddress]:
        return await asyncio.get_running_loop().run_in_executor(None, self.policy.check, host, port, protocol)

    async def open(self, addresses: list[IPAddress], port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        problems = []
        for address in addresses:
            try:
                return await asyncio.wait_for(asyncio.open_connection(str(address), port), CONNECT_TIMEOUT_SECONDS)
            except (OSError, TimeoutError) as exc:
                problems.append(f"{address}: {exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__}")
        raise EgressRefused(UNREACHABLE, f"port {port} does not answer ({'; '.join(problems)})")

    async def relay(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
        up_reader: asyncio.StreamReader, up_writer: asyncio.StreamWriter, *, rewrite_response: bool = False,
    ) -> None:
        try:
            upstream = self.response(up_reader, writer) if rewrite_response else pump(up_reader, writer)
            await asyncio.gather(pump(reader, up_writer), upstream)
        finally:
            with contextlib.suppress(OSError, RuntimeError):
                up_writer.close()

    async def response(self, up_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Relay a plain request's response with ``Connection: close`` (interim 1xx heads as they are)."""
        try:
            while True:
                raw = await up_reader.readuntil(b"\r\n\r\n")
                head = Head(raw)
                if head.first[1].startswith("1") and head.first[1] != "101":
                    writer.write(raw)
                    continue
                writer.write(render(" ".join(head.first), [*head.without({"connection", "proxy-connection", "keep-alive"}), ("Connection", "close")]))
                break
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, EgressRefused, ConnectionError, OSError):
            with contextlib.suppress(OSError, RuntimeError):
                writer.close()
            return
        await pump(up_reader, writer)

    async def associate(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, addresses: list[IPAddress], port: int) -> None:
        """A UDP association: datagrams framed on the stream, to and from the first address."""
        loop = asyncio.get_running_loop()
        last = [time.monotonic()]

        class Back(asyncio.DatagramProtocol):
            def datagram_received(self, data: bytes, addr: Any) -> None:
                last[0] = time.monotonic()
                writer.write(struct.pack("!H", len(data)) + data)

        address = addresses[0]
        try:
            transport, _ = await loop.create_datagram_endpoint(Back, remote_addr=(str(address), port))
        except OSError as exc:
            raise EgressRefused(UNREACHABLE, f"{address}:{port}/udp: {exc.strerror or exc}") from None
        try:
            writer.write(b"HTTP/1.1 200 Association established\r\n\r\n")
            while True:
                try:
                    size = struct.unpack("!H", await asyncio.wait_for(reader.readexactly(2), UDP_IDLE_SECONDS))[0]
                    data = await asyncio.wait_for(reader.readexactly(size), UDP_IDLE_SECONDS)
                except TimeoutError:
                    if time.monotonic() - last[0] >= UDP_IDLE_SECONDS:
                        return
                    continue
                except asyncio.IncompleteReadError:
                    return
                last[0] = time.monotonic()
                transport.sendto(data)
        finally:
            transport.close()

    async def refuse(self, writer: asyncio.StreamWriter, exc: EgressRefused) -> None:
        status = STATUS.get(exc.code, 403)
        body = f"{exc.code}: {exc.message}\n".encode()
        headers = [("Content-Type", "text/plain; charset=utf-8"), (REFUSED_HEADER, exc.code), ("Connection", "close"), ("Content-Length", str(len(body)))]
        with contextlib.suppress(OSError, RuntimeError):
            writer.write(render(f"HTTP/1.1 {status} {REASONS[status]}", headers) + body)
            await writer.drain()


async def serve_and_run(socket_path: Path, proxy: EgressProxy, command: list[str]) -> int:
    server = await asyncio.start_unix_server(proxy.handle, path=str(socket_path), limit=MAX_HEAD_BYTES)
    try:
        child = await asyncio.create_subprocess_exec(*command)  # stdin, stdout, stderr: ours (the MCP pipes)
        loop = asyncio.get_running_loop()

        def forward(sig: int) -> None:
            if child.returncode is None:
                child.send_signal(sig)

        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.add_signal_handler(sig, forward, sig)
        code = await child.wait()
    finally:
        server.close()
        with contextlib.suppress(OSError):
            socket_path.unlink()
        with contextlib.suppress(OSError):
            socket_path.parent.rmdir()
    return code if code >= 0 else 128 - code


def die_with_parent() -> None:
    """SIGTERM when the platform process that started this one dies (then the sandbox goes too)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    split = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--socket", required=True, type=Path)
    args = parser.parse_args(argv[:split])
    command = argv[split + 1:]
    if not command:
        parser.error("the command to run follows --")
    die_with_parent()
    config = json.loads(os.environ.pop(RULES_ENV, "{}") or "{}")
    proxy = EgressProxy(Policy.from_config(config), str(config.get("pack", "")))
    sys.exit(asyncio.run(serve_and_run(args.socket, proxy, command)))


if __name__ == "__main__":
    main()
