"""GET /api/health/: everyone learns ok/degraded; only loopback peers and the owner learn
what runs behind it."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

pytestmark = pytest.mark.django_db

PUBLIC_PEER = "203.0.113.9"  # TEST-NET-3: never loopback


def test_public_health_says_only_ok_or_degraded(owner: Any) -> None:
    response = Client(REMOTE_ADDR=PUBLIC_PEER).get("/api/health/")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


def test_loopback_peer_gets_health_details(owner: Any) -> None:
    body = Client(REMOTE_ADDR="127.0.0.1").get("/api/health/").json()
    assert body["status"] == "ok"
    assert {"database", "channel_layer", "brain"} <= body.keys()
    assert Client(REMOTE_ADDR="::1").get("/api/health/").json().keys() == body.keys()


def test_logged_in_owner_gets_health_details_from_anywhere(owner: Any) -> None:
    client = Client(REMOTE_ADDR=PUBLIC_PEER)
    client.force_login(owner)
    assert {"database", "channel_layer", "brain"} <= client.get("/api/health/").json().keys()


def test_logged_in_user_who_is_not_the_owner_gets_no_details(owner: Any) -> None:
    from accounts.models import User

    other = User.objects.create_user(username="visitor", password="visitor password 1")
    client = Client(REMOTE_ADDR=PUBLIC_PEER)
    client.force_login(other)
    assert client.get("/api/health/").json() == {"status": "ok"}


def test_unreachable_redis_is_degraded_and_public_health_still_names_nothing(owner: Any, settings: Any) -> None:
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    public = Client(REMOTE_ADDR=PUBLIC_PEER).get("/api/health/")
    assert public.status_code == 503 and public.json() == {"status": "degraded"}
    local = Client(REMOTE_ADDR="127.0.0.1").get("/api/health/")
    assert local.status_code == 503 and local.json()["channel_layer"] == "redis (unreachable)"
