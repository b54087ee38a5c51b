"""GET /api/health/: everyone learns ok, or degraded with stable reason codes; only loopback
peers and the owner learn what runs behind it and what failed how. Degraded includes a brain
role that does not answer (llm.probe)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from django.test import Client

from llm import probe, roles

pytestmark = pytest.mark.django_db

PUBLIC_PEER = "203.0.113.9"  # TEST-NET-3: never loopback


@pytest.fixture(autouse=True)
def _fresh_probe() -> Iterator[None]:
    """Each test sees its own brain, not the probe result an earlier test left cached."""
    probe.forget()
    yield
    probe.forget()


@pytest.fixture
def refusing_url() -> str:
    """An OpenAI-compatible base URL on a loopback port where nothing listens."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


def set_brain(base_url: str, *, provider: str = "ollama") -> None:
    roles.apply("brain", provider=provider, base_url=base_url, model="qwen2.5:7b", options={}, source="console")


def test_public_health_says_only_ok_or_degraded(owner: Any, brain: Any) -> None:
    response = Client(REMOTE_ADDR=PUBLIC_PEER).get("/api/health/")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


def test_loopback_peer_gets_health_details(owner: Any, brain: Any) -> None:
    body = Client(REMOTE_ADDR="127.0.0.1").get("/api/health/").json()
    assert body["status"] == "ok"
    assert {"database", "channel_layer", "brain"} <= body.keys()
    assert Client(REMOTE_ADDR="::1").get("/api/health/").json().keys() == body.keys()


def test_logged_in_owner_gets_health_details_from_anywhere(owner: Any, brain: Any) -> None:
    client = Client(REMOTE_ADDR=PUBLIC_PEER)
    client.force_login(owner)
    assert {"database", "channel_layer", "brain"} <= client.get("/api/health/").json().keys()


def test_logged_in_user_who_is_not_the_owner_gets_no_details(owner: Any, brain: Any) -> None:
    from accounts.models import User

    other = User.objects.create_user(username="visitor", password="visitor password 1")
    client = Client(REMOTE_ADDR=PUBLIC_PEER)
    client.force_login(other)
    assert client.get("/api/health/").json() == {"status": "ok"}


def test_unreachable_redis_is_degraded_and_public_health_names_only_the_reason(owner: Any, brain: Any, settings: Any) -> None:
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    public = Client(REMOTE_ADDR=PUBLIC_PEER).get("/api/health/")
    assert public.status_code == 503 and public.json() == {"status": "degraded", "reasons": ["channel_layer_unreachable"]}
    local = Client(REMOTE_ADDR="127.0.0.1").get("/api/health/")
    assert local.status_code == 503 and local.json()["channel_layer"] == "redis (unreachable)"


def test_a_brain_that_answers_is_ok_and_the_owner_learns_where_it_is(owner: Any, brain: Any) -> None:
    body = Client(REMOTE_ADDR="127.0.0.1").get("/api/health/").json()
    assert body["status"] == "ok"
    assert body["brain"] == "demo"  # the test's brain role is a demo brain (manage.py fake_brain's server) on loopback
    assert body["brain_answering"] == {"answering": True, "reason": "", "detail": f"{brain.base_url}/models answered HTTP 200"}


def test_a_brain_role_that_refuses_connections_is_degraded_with_the_reason(owner: Any, brain: Any, refusing_url: str) -> None:
    set_brain(refusing_url)
    public = Client(REMOTE_ADDR=PUBLIC_PEER).get("/api/health/")
    assert public.status_code == 503
    assert public.json() == {"status": "degraded", "reasons": ["brain_unreachable"]}  # no URL for the public
    local = Client(REMOTE_ADDR="127.0.0.1").get("/api/health/").json()
    assert local["brain_answering"]["reason"] == "brain_unreachable"
    assert local["brain_answering"]["detail"].startswith(f"cannot connect to {refusing_url}/models")


def test_liveness_is_ok_while_the_brain_is_down_and_tells_loopback_the_build(owner: Any, brain: Any, refusing_url: str) -> None:
    """``/api/health/live/`` asks only this process and its database: a brain that does not
    answer makes readiness 503 ``degraded`` and leaves liveness 200. Loopback peers (a switch's
    verify, the watchdog) learn the build; the public only the status."""
    set_brain(refusing_url)
    assert Client(REMOTE_ADDR=PUBLIC_PEER).get("/api/health/").status_code == 503
    public = Client(REMOTE_ADDR=PUBLIC_PEER).get("/api/health/live/")
    assert (public.status_code, public.json()) == (200, {"status": "ok"})
    local = Client(REMOTE_ADDR="127.0.0.1").get("/api/health/live/")
    assert local.status_code == 200
    assert local.json() == {"status": "ok", "database": local.json()["database"], "channel_layer": local.json()["channel_layer"], "build": None}


def test_a_database_that_does_not_answer_is_degraded_in_json_and_nothing_else_is_asked(
    owner: Any, brain: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The database probe failing (tests/e2e/test_outages.py takes PostgreSQL away for real):
    both answers are JSON 503 ``database_unavailable``; the registered checks, which read the
    database, are not asked, and neither is the session (only a loopback peer gets details)."""
    from yimi_project import views

    asked: list[str] = []

    async def brain_check() -> views.HealthCheck:
        asked.append("brain")
        return views.HealthCheck(True)

    monkeypatch.setattr(views, "_select_one", lambda timeout: False)
    monkeypatch.setitem(views._checks, "brain", brain_check)
    for path in ("/api/health/", "/api/health/live/"):
        public = Client(REMOTE_ADDR=PUBLIC_PEER).get(path)
        assert (public.status_code, public.json()) == (503, {"status": "degraded", "reasons": ["database_unavailable"]})
        owner_client = Client(REMOTE_ADDR=PUBLIC_PEER)
        owner_client.force_login(owner)
        assert owner_client.get(path).json() == {"status": "degraded", "reasons": ["database_unavailable"]}
        local = Client(REMOTE_ADDR="127.0.0.1").get(path).json()
        assert local["database"].endswith(" (unavailable)") and local["reasons"] == ["database_unavailable"]
    assert asked == []


def test_the_demo_brain_down_is_degraded_and_named_demo(owner: Any, refusing_url: str) -> None:
    """What a second `./yimi up` that did not start the demo brain used to report as ok."""
    roles.import_from_environment({})
    set_brain(refusing_url, provider="demo")
    local = Client(REMOTE_ADDR="127.0.0.1").get("/api/health/")
    assert local.status_code == 503
    assert local.json()["brain"] == "demo" and local.json()["reasons"] == ["brain_unreachable"]


def test_no_brain_role_yet_is_not_a_failure_and_health_does_not_import_one(owner: Any) -> None:
    """Before the first-start import (yimi_init does it before `./yimi up` serves) there is
    nothing to probe: said as such, not degraded."""
    from llm.models import ModelRole, ModelSettingsImport

    response = Client(REMOTE_ADDR="127.0.0.1").get("/api/health/")
    assert response.status_code == 200 and response.json()["brain"] == "not imported yet"
    assert response.json()["brain_answering"]["reason"] == "brain_not_configured"
    assert not ModelRole.objects.exists() and not ModelSettingsImport.objects.exists()  # health only reads


class _Refusing(BaseHTTPRequestHandler):
    """A provider that answers every request with the status its server names (401: the key is refused)."""

    def do_GET(self) -> None:
        self.server.seen_keys.append(self.headers.get("Authorization"))  # type: ignore[attr-defined]
        self.send_response(self.server.status)  # type: ignore[attr-defined]
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass


@pytest.fixture
def provider() -> Iterator[Any]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Refusing)
    server.status, server.seen_keys = 401, []  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize(("status", "reason"), [(401, "brain_unauthorized"), (403, "brain_unauthorized"), (500, "brain_error")])
def test_a_refused_key_or_a_failing_server_is_degraded(owner: Any, provider: Any, status: int, reason: str,
                                                      tmp_path: Any, settings: Any) -> None:
    from llm import keyring

    settings.DATA_DIR, settings.SECRETS_DIR = tmp_path, tmp_path / "secrets"
    keyring.ensure_master_key()
    provider.status = status
    roles.apply("brain", provider="hosted", base_url=f"http://127.0.0.1:{provider.server_port}/v1", model="m",
                options={}, api_key="sk-test-key", source="console")
    body = Client(REMOTE_ADDR="127.0.0.1").get("/api/health/").json()
    assert body["reasons"] == [reason]
    assert provider.seen_keys == ["Bearer sk-test-key"]  # the role's own key, to the URL it is stored for
    assert "sk-test-key" not in str(body)


def test_an_endpoint_without_models_still_answers(owner: Any, provider: Any) -> None:
    provider.status = 404
    set_brain(f"http://127.0.0.1:{provider.server_port}/v1")
    body = Client(REMOTE_ADDR="127.0.0.1").get("/api/health/").json()
    assert body["status"] == "ok" and body["brain"] == "configured"


def test_the_probe_is_cached_so_health_checks_do_not_load_the_brain(owner: Any, brain: Any) -> None:
    target = probe.read_target()
    assert isinstance(target, probe.Target)
    before = brain.connections
    first = probe.cached_probe(target, now=1000.0)
    again = probe.cached_probe(target, now=1000.0 + probe.CACHE_SECONDS - 0.1)
    assert first.answering and again is first and brain.connections == before + 1
    later = probe.cached_probe(target, now=1000.0 + probe.CACHE_SECONDS)
    assert later.answering and later is not first and brain.connections == before + 2


def test_a_changed_brain_role_is_probed_afresh_within_the_cache_time(owner: Any, brain: Any, refusing_url: str) -> None:
    assert probe.brain_status(now=1000.0).answering
    set_brain(refusing_url)
    status = probe.brain_status(now=1000.1)
    assert not status.answering and status.reason == "brain_unreachable"
