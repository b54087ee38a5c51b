"""Inside the sandbox: the way from a pack's client libraries to its egress proxy.

A host that declares egress has no network of its own; ``YIMI_EGRESS_SOCKET`` names the
Unix socket of its egress proxy (``egress_proxy.py``, outside), bound into the sandbox.
The host process starts ``start()`` before it serves: a listener on
``127.0.0.1:PROXY_PORT`` (the sandbox's own loopback, so every host can use the same
port) that passes each connection's bytes to the proxy socket unchanged. The sandbox's
environment points ``HTTP_PROXY``/``HTTPS_PROXY`` (and the lower-case names) at it, so
urllib, requests and httpx reach declared HTTP and HTTPS destinations as through any
forward proxy. The shim decides nothing: the proxy checks every destination.

For protocols that are not HTTP, packs use ``capabilities.packkit``:
``egress_connection(host, port)`` (a TCP stream through a CONNECT tunnel) and
``udp_endpoint(host, port)`` (a local UDP address in the sandbox whose datagrams the proxy
relays to and from ``host:port``). Without the socket (no egress declared, or
``YIMI_PACK_SANDBOX=none``) both go direct.

The standard library only.
"""

from __future__ import annotations

import ipaddress
import os
import selectors
import socket
import struct
import threading
import time

SOCKET_ENV = "YIMI_EGRESS_SOCKET"
PROXY_PORT = 3128
# Local addresses for UDP relays (127.0.0.0/8 is all loopback): one per destination, so a
# relay can listen on the destination's own port (python-miio's hello always goes to 54321).
UDP_RELAY_BASE = ipaddress.IPv4Address("127.77.0.1")
CONNECT_TIMEOUT_SECONDS = 30.0
UDP_IDLE_SECONDS = 30.0
UDP_MAX_ASSOCIATIONS = 64

_started = False
_lock = threading.Lock()
_udp_relays: dict[tuple[str, int], tuple[str, int]] = {}


class EgressRefused(ConnectionRefusedError):
    """The proxy refused a destination; ``code`` is its stable code (``capabilities.egress``)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code


def proxy_socket() -> str | None:
    return os.environ.get(SOCKET_ENV) or None


def proxy_url() -> str | None:
    """The HTTP proxy URL inside the sandbox, or None when the host has no egress proxy."""
    return f"http://127.0.0.1:{PROXY_PORT}" if proxy_socket() else None


def start() -> None:
    """Listen on the sandbox's loopback and pass each connection to the proxy (once per process)."""
    global _started
    path = proxy_socket()
    with _lock:
        if _started or path is None:
            return
        listener = socket.create_server(("127.0.0.1", PROXY_PORT), backlog=64)
        _started = True
    threading.Thread(target=_accept, args=(listener, path), name="egress-shim", daemon=True).start()


def _accept(listener: socket.socket, path: str) -> None:
    while True:
        client, _ = listener.accept()
        threading.Thread(target=_pass_through, args=(client, path), daemon=True).start()


def _pass_through(client: socket.socket, path: str) -> None:
    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        upstream.connect(path)
        back = threading.Thread(target=_copy, args=(upstream, client), daemon=True)
        back.start()
        _copy(client, upstream)
        back.join()
    except OSError:
        pass
    finally:
        client.close()
        upstream.close()


def _copy(source: socket.socket, sink: socket.socket) -> None:
    """Copy until end of stream, then half-close the other side."""
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        try:
            sink.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def _read_head(sock: socket.socket) -> tuple[int, str, str]:
    """The proxy's answer head: status, refusal code (or ""), and the body's first line."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            raise ConnectionResetError("the egress proxy closed the connection")
        data += chunk
        if len(data) > 65536:
            raise ConnectionResetError("the egress proxy's answer is too long")
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    code = next((line.split(":", 1)[1].strip() for line in lines[1:] if line.lower().startswith("yimi-egress-refused:")), "")
    return status, code, rest.decode("utf-8", "replace").strip()


def _tunnel(host: str, port: int, protocol: str, timeout: float) -> socket.socket:
    path = proxy_socket()
    assert path is not None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(path)
        authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        extra = f"Yimi-Egress-Protocol: {protocol}\r\n" if protocol != "tcp" else ""
        sock.sendall(f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n{extra}\r\n".encode())
        status, code, body = _read_head(sock)
    except BaseException:
        sock.close()
        raise
    if status != 200:
        sock.close()
        raise EgressRefused(code or f"http_{status}", body.partition(": ")[2] or body)
    sock.settimeout(None)
    return sock


def connection(host: str, port: int, timeout: float = CONNECT_TIMEOUT_SECONDS) -> socket.socket:
    """A TCP stream to ``host:port``: through the proxy when the host has one, else direct."""
    if proxy_socket() is None:
        return socket.create_connection((host, port), timeout=timeout)
    sock = _tunnel(host, port, "tcp", timeout)
    sock.settimeout(timeout)
    return sock


def udp_endpoint(host: str, port: int) -> tuple[str, int]:
    """Where to send datagrams meant for ``host:port``: a relay on the sandbox's loopback
    (same port), or ``(host, port)`` itself without a proxy. Raises ``EgressRefused`` when
    the proxy refuses the destination."""
    if proxy_socket() is None:
        return host, port
    key = (host, port)
    with _lock:
        if key in _udp_relays:
            return _udp_relays[key]
        _tunnel(host, port, "udp", CONNECT_TIMEOUT_SECONDS).close()  # refused now, not as a silent timeout
        local = str(UDP_RELAY_BASE + len(_udp_relays))
        relay = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        relay.bind((local, port))
        _udp_relays[key] = (local, port)
    threading.Thread(target=_udp_relay, args=(relay, host, port), name=f"egress-udp-{host}", daemon=True).start()
    return local, port


def _udp_relay(relay: socket.socket, host: str, port: int) -> None:
    """Datagrams from each local sender go through an association of its own, so replies
    find their way back to the sender that asked. One thread for the relay and all its
    associations (a client library opens a socket per request; a thread each would run
    into the host's process limit), which ends an association idle for ``UDP_IDLE_SECONDS``."""
    selector = selectors.DefaultSelector()
    selector.register(relay, selectors.EVENT_READ)
    streams: dict[tuple[str, int], socket.socket] = {}
    senders: dict[socket.socket, tuple[str, int]] = {}
    pending: dict[socket.socket, bytes] = {}
    last: dict[socket.socket, float] = {}

    def end(stream: socket.socket) -> None:
        if stream not in senders:
            return
        selector.unregister(stream)
        streams.pop(senders.pop(stream), None)
        pending.pop(stream, None)
        last.pop(stream, None)
        stream.close()

    while True:
        try:
            for key, _ in selector.select(timeout=5.0):
                sock = key.fileobj
                if sock is relay:
                    data, sender = relay.recvfrom(65535)
                    stream = streams.get(sender)
                    if stream is None:
                        try:
                            stream = _tunnel(host, port, "udp", CONNECT_TIMEOUT_SECONDS)
                        except OSError:
                            continue  # refused or unreachable: the sender's own timeout tells it
                        while len(streams) >= UDP_MAX_ASSOCIATIONS:
                            end(min(last, key=last.__getitem__))
                        streams[sender], senders[stream], pending[stream] = stream, sender, b""
                        selector.register(stream, selectors.EVENT_READ)
                    last[stream] = time.monotonic()
                    try:
                        stream.sendall(struct.pack("!H", len(data)) + data)
                    except OSError:
                        end(stream)
                    continue
                if not isinstance(sock, socket.socket) or sock not in senders:
                    continue  # ended earlier in this round
                try:
                    chunk = sock.recv(65536)
                except OSError:
                    chunk = b""
                if not chunk:
                    end(sock)
                    continue
                last[sock] = time.monotonic()
                buffer = pending[sock] + chunk
                while len(buffer) >= 2 and len(buffer) >= 2 + struct.unpack("!H", buffer[:2])[0]:
                    size = struct.unpack("!H", buffer[:2])[0]
                    relay.sendto(buffer[2:2 + size], senders[sock])
                    buffer = buffer[2 + size:]
                pending[sock] = buffer
            now = time.monotonic()
            for stream in [s for s, at in last.items() if now - at >= UDP_IDLE_SECONDS]:
                end(stream)
        except Exception:  # noqa: BLE001 - one bad datagram or association must not end the relay
            continue
