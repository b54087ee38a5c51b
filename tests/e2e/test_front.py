"""The TLS front (docker/front/) for real: nginx from Debian's package, rendered from the
same template and started by the same code as the compose service ``front``, in front of a
real daphne started as ``./yimi up`` starts it, with the production switch on
(``YIMI_PUBLIC_URL=https://…``).

Addresses: nginx reaches daphne from 127.0.0.1, the only trusted proxy here. Clients bind
their own loopback addresses (127.0.0.3, .4, .5), so "which client was it" is observable:
through the front daphne must see each client's address, directly it must believe no
forwarded header.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import ssl
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest
from django.conf import settings as django_settings
from django.db import connection

from accounts.devices import issue_pairing_code
from accounts.models import PairingGuessSlot
from devices.simulator import DeviceConnection, pair
from tests.conftest import db_async, need, pairing_payload
from tests.support.ports import free_port
from tests.support.process_support import subprocess_test_database_url, wait_for_sessions_to_end

ROOT = Path(__file__).resolve().parents[2]
PROXY = "127.0.0.1"  # nginx's source address towards daphne
CLIENT_A, CLIENT_B, DIRECT = "127.0.0.3", "127.0.0.4", "127.0.0.5"


def load_front() -> ModuleType:
    spec = importlib.util.spec_from_file_location("yimi_front", ROOT / "docker" / "front" / "front.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(15)


@dataclass
class Stack:
    front: str  # https://127.0.0.1:<nginx port>
    direct: str  # http://127.0.0.1:<daphne port>
    ca_file: Path
    daphne_log: Path

    def client(self, source: str, *, through_front: bool = True) -> httpx.Client:
        context = ssl.create_default_context(cafile=str(self.ca_file))
        transport = httpx.HTTPTransport(verify=context, local_address=source)
        return httpx.Client(base_url=self.front if through_front else self.direct, transport=transport, timeout=10)


@pytest.fixture(scope="module")
def stack(django_db_setup: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    nginx = shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin")
    need(nginx is not None, "nginx is not installed (Debian package nginx; .ci/run installs it)")
    assert nginx is not None
    front = load_front()
    work = tmp_path_factory.mktemp("front")
    daphne_port, front_port = free_port(), free_port()
    cert, key = front.ensure_certificates(work / "tls", front.front_names(f"https://localhost:{front_port}"))
    conf = front.write_config(
        work / "run",
        {
            "LISTEN": f"127.0.0.1:{front_port}",
            "UPSTREAM": f"127.0.0.1:{daphne_port}",
            "RESOLVER": "127.0.0.1",  # unused: the upstream is an address
            "TLS_CERT": str(cert),
            "TLS_KEY": str(key),
            "ACCESS_LOG": str(work / "access.log"),
        },
    )
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "yimi_project.settings",
        "DATABASE_URL": subprocess_test_database_url(),
        "YIMI_CHANNEL_PREFIX": f"yimi-front-{uuid.uuid4().hex[:8]}",
        "YIMI_DATA_DIR": str(django_settings.DATA_DIR),
        "YIMI_EMBEDDED_SWEEPER": "0",
        # The production switch, and nginx's address as the one trusted proxy.
        "YIMI_PUBLIC_URL": f"https://localhost:{front_port}",
        "YIMI_TRUSTED_PROXIES": PROXY,
        "PGAPPNAME": f"yimi-front-{daphne_port}",  # libpq tags daphne's database sessions
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("YIMI_DEBUG", None)
    daphne_log, nginx_log = work / "daphne.log", work / "nginx.log"
    daphne = subprocess.Popen(
        [str(Path(sys.executable).parent / "daphne"), "-b", "127.0.0.1", "-p", str(daphne_port), "yimi_project.asgi:application"],
        cwd=ROOT, env=env, stdout=open(daphne_log, "w"), stderr=subprocess.STDOUT,
    )
    procs = [daphne]
    try:
        procs.append(
            subprocess.Popen(
                [nginx, "-p", str(work / "run"), "-c", str(conf), "-e", "stderr"],
                stdout=open(nginx_log, "w"), stderr=subprocess.STDOUT,
            )
        )
        result = Stack(f"https://127.0.0.1:{front_port}", f"http://127.0.0.1:{daphne_port}", work / "tls" / "ca.pem", daphne_log)
        deadline = time.monotonic() + 60
        with result.client(CLIENT_A) as probe:
            while True:
                try:
                    if probe.get("/api/health/").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                    pytest.fail(
                        "front or daphne did not start:\n" + nginx_log.read_text()[-2000:] + daphne_log.read_text()[-3000:]
                    )
                time.sleep(0.2)
        yield result
    finally:
        for proc in reversed(procs):
            stop(proc)
        if connection.vendor == "postgresql":
            # daphne's kept connections end a moment after it exits; the test database is
            # dropped only once they have.
            wait_for_sessions_to_end(env["PGAPPNAME"])


def bad_pairing(client: httpx.Client, forged_for: str | None = None) -> httpx.Response:
    body, _ = pairing_payload("ABCD-EFGH")  # validly signed, but no such code
    headers = {"X-Forwarded-For": forged_for} if forged_for else {}
    return client.post("/api/pair/", json=body, headers=headers)


@pytest.mark.django_db(transaction=True)
def test_https_front_reaches_daphne_and_the_answer_carries_hsts(stack: Stack) -> None:
    with stack.client(CLIENT_A) as client:
        response = client.get("/api/health/")
    assert response.status_code == 200 and response.json()["status"] == "ok"
    assert response.headers["strict-transport-security"] == "max-age=31536000; includeSubDomains; preload"


@pytest.mark.django_db(transaction=True)
def test_pairing_limit_counts_each_client_behind_the_front_whatever_it_forwards(stack: Stack) -> None:
    """Behind a same-host proxy every peer is the proxy: the per-address limit holds only
    because the front's X-Forwarded-For is believed, and only its right-most hop."""
    with stack.client(CLIENT_A) as a, stack.client(CLIENT_B) as b:
        for i in range(django_settings.PAIRING_FAILURES_PER_IP):
            response = bad_pairing(a, forged_for=f"203.0.113.{i}")
            assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_code", response.text
        limited = bad_pairing(a, forged_for="203.0.113.99")
        assert limited.status_code == 429 and limited.json()["error"]["code"] == "rate_limited"
        other = bad_pairing(b)
        assert other.status_code == 400 and other.json()["error"]["code"] == "invalid_code"
    scopes = set(PairingGuessSlot.objects.filter(scope__startswith="address:").values_list("scope", flat=True))
    assert scopes == {f"address:{CLIENT_A}", f"address:{CLIENT_B}"}


@pytest.mark.django_db(transaction=True)
def test_forwarded_headers_from_an_untrusted_peer_are_not_believed(stack: Stack) -> None:
    """Directly on daphne (not the trusted proxy): a forged X-Forwarded-Proto does not
    make plain http count as HTTPS, so it is redirected; the health check is exempt."""
    with stack.client(DIRECT, through_front=False) as direct:
        forged = {"X-Forwarded-Proto": "https", "X-Forwarded-For": CLIENT_A}
        response = direct.post("/api/pair/", json={}, headers=forged)
        assert response.status_code == 301 and response.headers["location"].startswith("https://")
        assert direct.get("/api/health/", headers=forged).status_code == 200
        assert direct.get("/api/health/live/", headers=forged).status_code == 200  # compose's healthcheck
    assert not PairingGuessSlot.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_owner_logs_in_to_the_admin_through_the_front_with_secure_cookies(stack: Stack, settings: Any) -> None:
    from accounts.services import ensure_owner

    # The owner's password hashed as daphne (production settings) can check it.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.PBKDF2PasswordHasher"]
    assert ensure_owner("owner", "correct horse battery") is not None
    with stack.client(CLIENT_A) as client:
        login = client.get("/admin/login/?next=/admin/")
        assert login.status_code == 200
        assert "secure" in login.headers["set-cookie"].lower()
        response = client.post(
            "/admin/login/?next=/admin/",
            data={
                "username": "owner", "password": "correct horse battery",
                "csrfmiddlewaretoken": client.cookies["csrftoken"], "next": "/admin/",
            },
            headers={"Origin": stack.front, "Referer": stack.front + "/admin/login/"},
        )
        assert response.status_code == 302 and response.headers["location"] == "/admin/", response.text[:500]
        session_cookie = [c for c in response.headers.get_list("set-cookie") if c.startswith("sessionid=")]
        assert session_cookie and "secure" in session_cookie[0].lower()
        assert client.get("/admin/").status_code == 200


@pytest.mark.django_db(transaction=True)
async def test_device_pairs_and_holds_its_websocket_through_the_front(
    stack: Stack, owner: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The simulator, trusting the front's local CA as a phone would, pairs over HTTPS and
    authenticates over wss:// (the Upgrade is passed through)."""
    monkeypatch.setenv("SSL_CERT_FILE", str(stack.ca_file))
    _, code = await db_async(issue_pairing_code)(owner)
    phone = await pair(stack.front, code, kind="phone", name="phone behind the front")
    async with DeviceConnection(phone) as ws:
        assert ws.ready["type"] == "ready"
        await ws.send({"type": "ping", "id": "through-the-front"})
        assert (await ws.next_frame("pong"))["type"] == "pong"
    assert "WSCONNECT /ws/device/" in stack.daphne_log.read_text()


def raw_status(stack: Stack, method: str, path: str) -> int:
    """Send ``path`` exactly as written (no client-side normalisation) through the front."""
    port = int(stack.front.rsplit(":", 1)[1])
    context = ssl.create_default_context(cafile=str(stack.ca_file))
    with socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(CLIENT_A, 0)) as raw:
        with context.wrap_socket(raw, server_hostname="localhost") as tls:
            tls.sendall(f"{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".encode())
            status_line = tls.recv(4096).split(b"\r\n", 1)[0].decode()
    return int(status_line.split()[1])


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "path", ["/internal/gateway/decide", "/internal/", "/internal", "/%69nternal/memory/", "//internal/x", "/api/../internal/x"]
)
def test_front_refuses_internal_paths_without_forwarding_them(stack: Stack, path: str) -> None:
    assert raw_status(stack, "GET", path) == 404
    assert raw_status(stack, "POST", path) == 404
    marker = uuid.uuid4().hex
    assert raw_status(stack, "GET", f"/api/{marker}/") == 404  # a control: forwarded, and logged by daphne
    deadline = time.monotonic() + 10
    while marker not in stack.daphne_log.read_text():
        assert time.monotonic() < deadline, "daphne did not log the control request"
        time.sleep(0.1)
    assert "internal" not in stack.daphne_log.read_text().lower()
