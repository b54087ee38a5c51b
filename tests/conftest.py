from __future__ import annotations

import base64
import json
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from brain.fake_server import FakeBrainServer, Rule, Script
from devices.signatures import auth_message, pairing_message

REQUIRE_SERVICES = os.environ.get("YIMI_REQUIRE_SERVICES") == "1"


def need(condition: bool, reason: str) -> None:
    """Skip when a real service is missing, except in CI where that is a failure."""
    if condition:
        return
    if REQUIRE_SERVICES:
        pytest.fail(f"required service missing in CI: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session", autouse=True)
def _close_internal_db_threads(django_db_setup: Any, django_db_blocker: Any) -> Iterator[None]:
    """The internal endpoints keep connections on their own threads; close them before
    the test database is dropped."""
    yield
    from yimi_project.internal import close_thread_connections

    with django_db_blocker.unblock():
        close_thread_connections()


@pytest.fixture(scope="session")
def fake_brain() -> Iterator[FakeBrainServer]:
    server = FakeBrainServer(script=Script())
    server.start_in_thread()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def brain(fake_brain: FakeBrainServer, settings: Any) -> Iterator[FakeBrainServer]:
    """The demo brain, with an empty script, configured as this test's brain."""
    settings.BRAIN_BASE_URL = fake_brain.base_url
    settings.BRAIN_TIMEOUT_SECONDS = 5.0
    fake_brain.script.rules.clear()
    fake_brain.script.requests.clear()
    yield fake_brain
    fake_brain.script.rules.clear()


def script(server: FakeBrainServer, **rule: Any) -> None:
    server.script.rules.append(Rule(**rule))


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
    from devices.services import PairingRequest, issue_pairing_code, pair_device

    def make(kind: str = "phone", *, guest: bool = False, **extra: Any) -> SimDevice:
        _, code = issue_pairing_code(owner, for_guest=guest)
        body, key = pairing_payload(code, kind=kind, **extra)
        device = pair_device(PairingRequest.from_payload(body), client_ip="127.0.0.1")
        return SimDevice(device=device, key=key)

    return make


async def open_socket(sim: SimDevice | None = None, *, authenticate: bool = True) -> tuple[WebsocketCommunicator, dict[str, Any]]:
    """Connect to /ws/device/; with ``authenticate`` answer the challenge as ``sim``."""
    from yimi_project.asgi import application

    comm = WebsocketCommunicator(application, "/ws/device/")
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


async def receive_until(comm: WebsocketCommunicator, *types: str, timeout: float = 5.0) -> dict[str, Any]:
    while True:
        frame = json.loads(await comm.receive_from(timeout=timeout))
        if frame["type"] in types:
            return frame


def new_client_id() -> str:
    return uuid.uuid4().hex


db_async = database_sync_to_async
