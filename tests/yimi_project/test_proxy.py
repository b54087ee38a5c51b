"""Behind a reverse proxy: X-Forwarded-* believed from trusted proxies only
(yimi_project/proxy.py), and the production switch (YIMI_PUBLIC_URL=https://…) passing
``manage.py check --deploy`` while the embedded default stays plain http."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import AsyncClient, Client

from tests.conftest import pairing_payload
from yimi_project.proxy import forwarded_client, public_origin, trusted_networks

ROOT = Path(__file__).resolve().parents[2]
PROXY = "127.0.0.1"  # a same-host proxy: every request arrives from it


def bad_pairing(client: Client, **headers: str) -> Any:
    body, _ = pairing_payload("ABCD-EFGH")  # validly signed, but no such code
    return client.post("/api/pair/", body, content_type="application/json", headers=headers)


@pytest.mark.parametrize(
    ("peer", "forwarded_for", "client"),
    [
        ("10.0.0.2", "198.51.100.1, 203.0.113.7", "203.0.113.7"),  # right-most: the proxy wrote it
        ("10.0.0.2", "198.51.100.1, 203.0.113.7, 10.0.0.3", "203.0.113.7"),  # trusted hops are skipped
        ("10.0.0.2", "10.0.0.5, 10.0.0.3", "10.0.0.5"),  # all trusted: the left-most
        ("10.0.0.2", "203.0.113.7, not-an-address", "10.0.0.2"),  # garbage ends the walk at the trusted hop
        ("10.0.0.2", "", "10.0.0.2"),
        ("10.0.0.2", None, "10.0.0.2"),
        ("::ffff:10.0.0.2", "2001:db8::7", "2001:db8::7"),  # IPv4-mapped peer, IPv6 client
        ("10.0.0.2", "[2001:db8::7]", "2001:db8::7"),
        ("192.0.2.1", "203.0.113.7", None),  # not a trusted proxy: the header says nothing
        (None, "203.0.113.7", None),  # no address (a Unix socket)
        ("unix", "203.0.113.7", None),
    ],
)
def test_client_is_the_right_most_untrusted_forwarded_address(peer: str | None, forwarded_for: str | None, client: str | None) -> None:
    assert forwarded_client(peer, forwarded_for, trusted_networks(["10.0.0.0/24"])) == client


def test_malformed_trusted_proxy_is_a_configuration_error() -> None:
    with pytest.raises(ImproperlyConfigured):
        trusted_networks(["10.0.0.0/24", "proxy.example.org"])
    assert trusted_networks([]) == ()


@pytest.mark.parametrize(
    ("url", "host", "origin"),
    [
        ("https://Yimi.Example.org", "yimi.example.org", "https://yimi.example.org"),
        ("https://yimi.example.org:443/", "yimi.example.org", "https://yimi.example.org"),
        ("https://yimi.example.org:8443", "yimi.example.org", "https://yimi.example.org:8443"),
        ("https://[2001:db8::1]:8443", "[2001:db8::1]", "https://[2001:db8::1]:8443"),
    ],
)
def test_public_url_gives_the_allowed_host_and_the_trusted_origin(url: str, host: str, origin: str) -> None:
    assert public_origin(url) == (host, origin)


@pytest.mark.parametrize("url", ["yimi.example.org", "ftp://yimi.example.org", "https://yimi.example.org/yimi/", "https://u:p@yimi.example.org"])
def test_public_url_that_is_not_a_plain_origin_is_refused(url: str) -> None:
    with pytest.raises(ImproperlyConfigured):
        public_origin(url)


@pytest.mark.django_db
def test_forwarded_for_is_ignored_without_trusted_proxies(settings: Any) -> None:
    """The embedded default trusts no proxy: a client cannot pick its own rate-limit bucket."""
    settings.YIMI_TRUSTED_PROXIES = []
    client = Client(REMOTE_ADDR="192.0.2.10")
    for i in range(settings.PAIRING_FAILURES_PER_IP):
        assert bad_pairing(client, x_forwarded_for=f"203.0.113.{i}").json()["error"]["code"] == "invalid_code"
    assert bad_pairing(client, x_forwarded_for="203.0.113.99").json()["error"]["code"] == "rate_limited"


@pytest.mark.django_db
def test_pairing_limit_is_per_client_behind_a_trusted_same_host_proxy(settings: Any) -> None:
    settings.YIMI_TRUSTED_PROXIES = [PROXY]
    proxy = Client(REMOTE_ADDR=PROXY)
    for _ in range(settings.PAIRING_FAILURES_PER_IP):
        assert bad_pairing(proxy, x_forwarded_for="203.0.113.7").json()["error"]["code"] == "invalid_code"
    # The client forged a left-hand entry; the proxy appended the real address.
    assert bad_pairing(proxy, x_forwarded_for="198.51.100.1, 203.0.113.7").json()["error"]["code"] == "rate_limited"
    assert bad_pairing(proxy, x_forwarded_for="203.0.113.8").json()["error"]["code"] == "invalid_code"


@pytest.mark.django_db
async def test_async_requests_see_the_forwarded_client(settings: Any) -> None:
    """The middleware's async path (daphne serves Django as ASGI)."""
    settings.YIMI_TRUSTED_PROXIES = [PROXY]
    settings.ALLOWED_HOSTS = ["testserver"]
    body = (await AsyncClient(REMOTE_ADDR=PROXY).get("/api/health/", headers={"x-forwarded-for": "203.0.113.7"})).json()
    assert body == {"status": "ok"}  # a public client: no details, though the peer is loopback
    assert {"database"} <= (await AsyncClient(REMOTE_ADDR=PROXY).get("/api/health/")).json().keys()


@pytest.mark.django_db
def test_forwarded_proto_counts_only_from_a_trusted_proxy(settings: Any) -> None:
    settings.YIMI_TRUSTED_PROXIES = [PROXY]
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    settings.SECURE_SSL_REDIRECT = True
    forged = Client(REMOTE_ADDR="192.0.2.10").get("/admin/login/", headers={"x-forwarded-proto": "https"})
    assert forged.status_code == 301 and forged["Location"].startswith("https://")
    assert Client(REMOTE_ADDR=PROXY).get("/admin/login/", headers={"x-forwarded-proto": "https"}).status_code == 200


def check_deploy(tmp_path: Path, **environment: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("YIMI_") and k != "DJANGO_SETTINGS_MODULE"}
    (tmp_path / "secrets").mkdir(exist_ok=True)
    env.update(
        DJANGO_SETTINGS_MODULE="yimi_project.settings",
        YIMI_DATA_DIR=str(tmp_path / "data"),
        YIMI_SECRETS_DIR=str(tmp_path / "secrets"),
        **environment,
    )
    return subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )


def test_production_settings_pass_check_deploy_without_any_warning(tmp_path: Path) -> None:
    result = check_deploy(tmp_path, YIMI_PUBLIC_URL="https://yimi.example.org", YIMI_TRUSTED_PROXIES="172.30.57.10")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "WARNING" not in output and "System check identified no issues" in output, output


def test_embedded_default_is_plain_http_and_check_deploy_says_so(tmp_path: Path) -> None:
    """No switch, no HTTPS settings: check --deploy names exactly what the switch sets."""
    result = check_deploy(tmp_path)
    assert result.returncode == 1
    for warning in ("security.W004", "security.W008", "security.W012", "security.W016"):
        assert warning in result.stderr


@pytest.mark.django_db
def test_owner_logs_in_to_the_admin_over_http_on_the_embedded_default(owner: Any) -> None:
    client = Client(enforce_csrf_checks=True)  # plain http, as `./yimi up` serves it
    login = client.get("/admin/login/?next=/admin/")
    assert login.status_code == 200 and not login.cookies["csrftoken"]["secure"]
    response = client.post(
        "/admin/login/?next=/admin/",
        {"username": "owner", "password": "correct horse battery", "csrfmiddlewaretoken": client.cookies["csrftoken"].value, "next": "/admin/"},
    )
    assert response.status_code == 302 and response["Location"] == "/admin/"
    assert not response.cookies["sessionid"]["secure"]
    assert client.get("/admin/").status_code == 200
