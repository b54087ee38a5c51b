from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import socket
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from asgiref.testing import ApplicationCommunicator
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from accounts.signatures import auth_message, pairing_message
from llm.fake_server import FakeBrainServer, Rule, Script

REQUIRE_SERVICES = os.environ.get("YIMI_REQUIRE_SERVICES") == "1"


def need(condition: bool, reason: str) -> None:
    """Skip when a real service is missing, except in CI where that is a failure."""
    if condition:
        return
    if REQUIRE_SERVICES:
        pytest.fail(f"required service missing in CI: {reason}")
    pytest.skip(reason)


def need_program(program: str, package: str = "") -> None:
    """``need`` for a Debian program the code under test runs (ffmpeg, bwrap, nginx...)."""
    import shutil

    found = shutil.which(program) or shutil.which(program, path="/usr/sbin")
    need(found is not None, f"{program} is not installed (apt-get install {package or program}; .ci/run installs it)")


@pytest.fixture(scope="session", autouse=True)
def _close_internal_db_threads(django_db_setup: Any, django_db_blocker: Any) -> Iterator[None]:
    """The internal endpoints keep connections on their own threads; close them before
    the test database is dropped."""
    yield
    from yimi_project.internal import close_thread_connections

    with django_db_blocker.unblock():
        close_thread_connections()


@pytest.fixture(scope="session", autouse=True)
def _shipped_packs_granted_their_secrets() -> None:
    """As on an instance after ``yimi_init``: the shipped packs are granted the secrets they
    were made for (``capabilities.registry.grants.SHIPPED_SECRETS``), in the grants file the
    pack hosts read. Tests of the grants themselves use a registry directory of their own."""
    from capabilities.mcp_host.secret_grants import write_grants
    from capabilities.registry.grants import shipped_grant_rows

    write_grants(shipped_grant_rows())


DB_FIXTURES = ("transactional_db", "db", "django_db_reset_sequences", "django_db_serialized_rollback")


@pytest.fixture(autouse=True)
def _call_events_stored_with_their_test(request: pytest.FixtureRequest) -> Iterator[None]:
    """Call events (``companion.events``) a test recorded are written before its database
    is emptied. The buffer is the process's and its writer thread wakes every 0.5 s, so
    without this a call's last events would wait into the next test, whose first flush
    (one bulk insert) they would fail: their calls are gone. The test's database fixture is
    set up first, so this fixture's teardown runs before it."""
    uses_db = next((name for name in DB_FIXTURES if name in request.fixturenames), None)
    if uses_db is None and request.node.get_closest_marker("django_db") is None:
        yield
        return
    if uses_db is not None:
        request.getfixturevalue(uses_db)
    yield
    from companion import events as call_events

    call_events.flush()


@pytest.fixture(scope="session")
def fake_brain() -> Iterator[FakeBrainServer]:
    server = FakeBrainServer(script=Script())
    server.start_in_thread()
    yield server
    server.shutdown()
    server.server_close()


def use_brain(base_url: str, **options: Any) -> None:
    """Make ``base_url`` the brain role (``llm.roles.apply``, as the console would), after
    the first-start import of an empty environment; ``options`` override the role's options
    (5 s timeout by default). Synchronous: wrap it in ``db_async`` inside async tests."""
    from llm import roles

    roles.import_from_environment({})
    roles.apply(
        "brain", provider="demo", base_url=base_url, model="yimi-demo", options={"timeout_seconds": 5.0, **options},
        api_key=None, source="console", note="the test's demo brain",
    )


@pytest.fixture
def brain(fake_brain: FakeBrainServer, db: Any) -> Iterator[FakeBrainServer]:
    """The demo brain, with an empty script, configured as this test's brain role."""
    use_brain(fake_brain.base_url)
    fake_brain.script.rules.clear()
    fake_brain.script.requests.clear()
    yield fake_brain
    fake_brain.script.rules.clear()


def script(server: FakeBrainServer, **rule: Any) -> None:
    server.script.rules.append(Rule(**rule))


class CallbackScript(Script):
    """The fake brain's script with a hook called on every request (its number, from 1)."""

    def __init__(self, rules: Iterable[Rule], on_request: Callable[[int], None]) -> None:
        super().__init__(rules=list(rules))
        self.on_request = on_request

    def scripted_rule(self, body: dict[str, Any]) -> Rule | None:
        self.on_request(len(self.requests))
        return super().scripted_rule(body)


# A run whose main turn delegates an errand (request 1), whose sub-agent then asks (request 2)
# and finishes, and which reports the result: a hook on request 2 acts while the run is under way.
MID_RUN_RULES = (
    Rule(match="Background task finished", reply="Done."),
    Rule(when="tool", reply="Nothing to do, finished."),
    Rule(match="^errand$", forbids_tool="steer", tool_calls=[{"name": "nothing__here", "arguments": {}}], reply=""),
    Rule(reply="Sure."),
)


@pytest.fixture
def owner(db: Any) -> Any:
    from accounts.services import ensure_owner

    made = ensure_owner("owner", "correct horse battery")
    assert made is not None
    return made.user


@dataclass
class SimDevice:
    device: Any
    key: Ed25519PrivateKey

    def sign(self, message: bytes) -> str:
        return base64.b64encode(self.key.sign(message)).decode()

    def signed(self, method: str, path: str, body: bytes = b"", *, host: str = "testserver", **kwargs: Any) -> dict[str, str]:
        """Django test-client headers (``HTTP_…``) for a signed device request, made by the
        simulator's ``signed_headers`` (the protocol's reference client)."""
        from devices.simulator import signed_headers

        headers = signed_headers(self.sign, str(self.device.id), method, host, path, body, **kwargs)
        return {"HTTP_" + name.upper().replace("-", "_"): value for name, value in headers.items()}


def new_keypair() -> tuple[Ed25519PrivateKey, str]:
    key = Ed25519PrivateKey.generate()
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return key, base64.b64encode(raw).decode()


def pairing_payload(code: str, *, kind: str = "phone", key: Ed25519PrivateKey | None = None, **extra: Any) -> tuple[dict[str, Any], Ed25519PrivateKey]:
    if key is None:
        key, public = new_keypair()
    else:
        raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        public = base64.b64encode(raw).decode()
    normalized = code.replace("-", "").upper()
    body = {
        "code": code,
        "kind": kind,
        "name": f"test {kind}",
        "capture_channels": ["phone_app"],
        "public_key": public,
        "signature": base64.b64encode(key.sign(pairing_message(normalized, public))).decode(),
        **extra,
    }
    return body, key


@pytest.fixture
def make_device(owner: Any) -> Any:
    """Pair a device through the real pairing service."""
    from accounts.devices import PairingRequest, issue_pairing_code, pair_device

    def make(kind: str = "phone", *, guest: bool = False, **extra: Any) -> SimDevice:
        _, code = issue_pairing_code(owner, for_guest=guest)
        body, key = pairing_payload(code, kind=kind, **extra)
        device = pair_device(PairingRequest.from_payload(body), client_ip="127.0.0.1")
        return SimDevice(device=device, key=key)

    return make


# How long a socket test waits for the server's next message. Channels' communicator waits
# 1 s by default, too little on a busy 2-core machine; a passing test never waits this long.
SOCKET_TIMEOUT = 10.0


class DeviceSocket(WebsocketCommunicator):
    """Channels' test websocket with ``SOCKET_TIMEOUT`` as every wait's default.

    Its two primitives are asgiref's, not Channels': Channels' test communicator makes
    ``channels.db.close_old_connections`` a no-op while the test sends or waits (for
    Django's TestCase, whose one transaction a close would end). With the connection pool
    that kept every connection a consumer's ``database_sync_to_async`` call borrowed while
    the test waited: one socket's thread held it to the end, one pooled connection lost per
    socket, until after ~20 sockets in one process every database call waited the pool's 30 s
    and failed (PoolTimeout); an event loop's teardown can then wait those 30 s for each
    cancelled call in turn (asgiref lets a cancelled call's thread finish). A consumer's
    threads never hold the test's own transaction, so they close as in production."""

    async def send_input(self, message: Any) -> None:
        await ApplicationCommunicator.send_input(self, message)

    async def connect(self, timeout: float = SOCKET_TIMEOUT) -> Any:
        return await super().connect(timeout)

    async def receive_output(self, timeout: float = SOCKET_TIMEOUT) -> Any:
        return await ApplicationCommunicator.receive_output(self, timeout)

    async def receive_from(self, timeout: float = SOCKET_TIMEOUT) -> Any:
        return await super().receive_from(timeout)

    async def receive_json_from(self, timeout: float = SOCKET_TIMEOUT) -> Any:
        return await super().receive_json_from(timeout)

    async def disconnect(self, code: int = 1000, timeout: float = SOCKET_TIMEOUT) -> None:
        await super().disconnect(code, timeout)


def device_socket(path: str = "/ws/device/") -> DeviceSocket:
    from yimi_project.asgi import application

    return DeviceSocket(application, path)


async def open_socket(
    sim: SimDevice | None = None, *, authenticate: bool = True, path: str = "/ws/device/"
) -> tuple[WebsocketCommunicator, dict[str, Any]]:
    """Connect to /ws/device/ (or ``path``); with ``authenticate`` answer the challenge as ``sim``."""
    comm = device_socket(path)
    connected, _ = await comm.connect()
    assert connected
    challenge = await comm.receive_json_from()
    assert challenge["type"] == "challenge"
    if not authenticate or sim is None:
        return comm, challenge
    await comm.send_json_to(
        {"type": "auth", "device_id": str(sim.device.id), "signature": sim.sign(auth_message(challenge["nonce"], str(sim.device.id)))}
    )
    ready = await comm.receive_json_from()
    assert ready["type"] == "ready", ready
    return comm, ready


async def receive_until(comm: WebsocketCommunicator, *types: str, timeout: float = SOCKET_TIMEOUT) -> dict[str, Any]:
    while True:
        frame = json.loads(await comm.receive_from(timeout=timeout))
        if frame["type"] in types:
            return frame


def new_client_id() -> str:
    return uuid.uuid4().hex


db_async = database_sync_to_async


# --- the internal listener (a Unix socket) and per-call capabilities -------------------------


def pack_capability(owner_id: Any, *, pack: str, category: str, apis: list[str], tool: str = "", **target: Any) -> str:
    """A capability as the gateway issues it for one executing call."""
    from yimi_project import call_capability

    claims = {
        "call": str(uuid.uuid4()), "owner": owner_id, "pack": pack, "tool": tool or f"{pack}__x", "category": category,
        "target": {k: str(v) for k, v in target.items()}, "apis": apis,
    }
    return call_capability.mint(call_capability.PACK, claims, ttl_seconds=120)


def platform_paths(root: Path, **overrides: Path) -> Any:
    """Where a test's packs find their directories (capabilities.mcp_host.sandbox)."""
    from capabilities.mcp_host.sandbox import PlatformPaths

    fields = {"data_dir": root / "data", "workspace_dir": root / "ws", "mail_dir": root / "mail", "secrets_dir": root / "secrets"}
    return PlatformPaths(**{**fields, **overrides, "internal_socket": overrides.get("internal_socket")})


def internal_client(**headers: str) -> Any:
    """A test client whose requests arrive on the internal listener."""
    from django.test import Client

    from yimi_project.internal import INTERNAL_LISTENER_META

    return Client(headers=headers, **{INTERNAL_LISTENER_META: True})


class UnixWSGIServer:
    """The platform's internal listener for tests: Django over a real Unix socket (as
    daphne's ``-u`` serves it), in a thread of the test process, so sandboxed packs reach
    the test database.

    Like daphne, it reads a request's whole body before Django sees the request. wsgiref
    alone does not: a request refused from its headers alone (a pack's POST answered 400
    or 403) had its connection closed with the body unread, and a client whose body had not
    all been sent yet (a pack process descheduled between sending the headers and the
    body, on a busy machine) got EPIPE instead of the answer: ``PlatformLost``
    (BrokenPipeError) in tests/capabilities/test_pack_sandbox.py."""

    def __init__(self, path: Path) -> None:
        import socketserver
        import threading
        from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

        from django.core.wsgi import get_wsgi_application

        from yimi_project.internal import INTERNAL_LISTENER_META

        django_app = get_wsgi_application()

        def app(environ: dict[str, Any], start_response: Any) -> Any:
            environ[INTERNAL_LISTENER_META] = True
            length = int(environ.get("CONTENT_LENGTH") or 0)
            environ["wsgi.input"] = io.BytesIO(environ["wsgi.input"].read(length) if length > 0 else b"")
            return django_app(environ, start_response)

        class Handler(WSGIRequestHandler):
            def setup(self) -> None:
                super().setup()
                self.client_address = ("", 0)  # a Unix socket peer has no address

            def log_message(self, format: str, *args: Any) -> None:
                pass

        class Server(socketserver.ThreadingMixIn, WSGIServer):
            address_family = socket.AF_UNIX
            daemon_threads = True

            def server_bind(self) -> None:
                socketserver.TCPServer.server_bind(self)
                self.server_name, self.server_port = "internal", 0
                self.setup_environ()

        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)
        self.path = path
        self.server = Server(str(path), Handler)
        self.server.set_app(app)
        self.thread = threading.Thread(target=self.server.serve_forever, name="internal-listener", daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.path.unlink(missing_ok=True)


class UnixASGIServer:
    """The internal listener as ``./yimi up`` serves it: the platform's ASGI application
    (``yimi_project.asgi``) over a real Unix socket, on the event loop of the test's own
    websockets, as daphne serves the device sockets and the internal listener on one loop
    of one process. On the in-memory channel layer that matters: a layer hands messages
    only between consumers of one loop, so the Mac relay (``devices.mac.relay``) must wait
    on the loop the Mac's socket reads on. ``UnixWSGIServer`` runs each request on a loop
    of its own thread, where the Mac's acceptance never arrives (``mac_offline``).

    One request per connection (answered with ``Connection: close``); the body is read
    whole before the application sees the request, as daphne does."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.unlink(missing_ok=True)
        self.server = await asyncio.start_unix_server(self._serve, path=str(self.path))

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()
        self.path.unlink(missing_ok=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        from urllib.parse import unquote

        from yimi_project.asgi import application

        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            writer.close()
            return
        method, target, _version = head[0].split(" ", 2)
        headers = [(name.strip().lower().encode("latin-1"), value.strip().encode("latin-1"))
                   for name, _, value in (line.partition(":") for line in head[1:] if line)]
        length = int(dict(headers).get(b"content-length", b"0"))
        body = await reader.readexactly(length) if length else b""
        path, _, query = target.partition("?")
        scope = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
            "path": unquote(path), "raw_path": path.encode("latin-1"), "query_string": query.encode("latin-1"),
            "root_path": "", "headers": headers, "client": None, "server": None,  # a Unix socket, as daphne's -u
        }
        received = False
        status, response_headers, chunks = 500, [], []

        async def receive() -> dict[str, Any]:
            nonlocal received
            if not received:
                received = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await asyncio.Future()  # no disconnect before the answer

        async def send(message: dict[str, Any]) -> None:
            nonlocal status, response_headers
            if message["type"] == "http.response.start":
                status, response_headers = message["status"], list(message.get("headers", []))
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))

        await application(scope, receive, send)
        payload = b"".join(chunks)
        lines = [f"HTTP/1.1 {status} -".encode()]
        lines += [name + b": " + value for name, value in response_headers if name.lower() not in (b"content-length", b"connection")]
        lines += [b"Content-Length: " + str(len(payload)).encode(), b"Connection: close"]
        writer.write(b"\r\n".join(lines) + b"\r\n\r\n" + payload)
        await writer.drain()
        writer.close()


@pytest.fixture
async def internal_listener_on_loop(transactional_db: Any, settings: Any) -> AsyncIterator[Path]:
    """The internal listener on ``settings.YIMI_INTERNAL_SOCKET``, on this test's event loop
    (``UnixASGIServer``)."""
    server = UnixASGIServer(Path(settings.YIMI_INTERNAL_SOCKET))
    await server.start()
    try:
        yield server.path
    finally:
        await server.close()


@pytest.fixture
def internal_listener(transactional_db: Any, settings: Any) -> Iterator[Path]:
    """The internal listener on ``settings.YIMI_INTERNAL_SOCKET`` for this test."""
    server = UnixWSGIServer(Path(settings.YIMI_INTERNAL_SOCKET))
    try:
        yield server.path
    finally:
        server.close()


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A loopback port something is listening on for the test's duration."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]
