from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import pytest
from django.test import Client

from accounts.devices import accept_request_nonce
from accounts.models import SignedRequestNonce
from memory.timeline.entries import append_entry
from yimi_project.errors import YimiError

pytestmark = pytest.mark.django_db


def signed_get(sim: Any, path: str, *, ts: int | None = None, sign_path: str | None = None, **kwargs: Any) -> Any:
    headers = sim.signed("GET", sign_path or path, timestamp=ts, **kwargs)
    return Client().get(path, **headers)


def test_device_reads_the_timeline_in_pages_with_a_signed_request(make_device: Any) -> None:
    sim = make_device()
    for i in range(5):
        append_entry(owner_id=sim.device.owner_id, kind="notice", text=f"n{i}")
    response = signed_get(sim, "/api/timeline/?after=1&limit=2")
    assert response.status_code == 200, response.content
    body = response.json()
    assert [e["seq"] for e in body["entries"]] == [2, 3] and body["has_more"] is True and body["next_after"] == 3


def test_unsigned_request_is_refused(owner: Any) -> None:
    response = Client().get("/api/timeline/")
    assert response.status_code in (401, 403) and response.json()["error"]["code"] == "not_authenticated"


def test_expired_timestamp_is_refused(make_device: Any) -> None:
    sim = make_device()
    response = signed_get(sim, "/api/timeline/", ts=int(time.time()) - 3600)
    assert response.status_code in (401, 403) and response.json()["error"]["code"] == "not_authenticated"


def test_signature_for_another_path_is_refused(make_device: Any) -> None:
    sim = make_device()
    response = signed_get(sim, "/api/timeline/?after=0", sign_path="/api/timeline/?after=5")
    assert response.json()["error"]["code"] == "not_authenticated"


def test_replayed_request_is_refused(make_device: Any) -> None:
    sim = make_device()
    headers = sim.signed("GET", "/api/timeline/")
    assert Client().get("/api/timeline/", **headers).status_code == 200
    replay = Client().get("/api/timeline/", **headers)
    assert replay.status_code == 401 and replay.json()["error"]["code"] == "request_replayed"
    # a fresh nonce is a new request
    assert signed_get(sim, "/api/timeline/").status_code == 200


def test_request_signed_for_another_host_is_refused(make_device: Any) -> None:
    sim = make_device()
    headers = sim.signed("GET", "/api/timeline/", host="localhost")
    assert Client().get("/api/timeline/", **headers).status_code == 200
    headers = sim.signed("GET", "/api/timeline/", host="localhost") | {"HTTP_HOST": "127.0.0.1"}
    moved = Client().get("/api/timeline/", **headers)
    assert moved.status_code == 401 and moved.json()["error"]["code"] == "not_authenticated"


def test_request_without_a_nonce_is_refused(make_device: Any) -> None:
    sim = make_device()
    headers = sim.signed("GET", "/api/timeline/")
    del headers["HTTP_X_YIMI_NONCE"]
    assert Client().get("/api/timeline/", **headers).json()["error"]["code"] == "not_authenticated"
    short = sim.signed("GET", "/api/timeline/", nonce="too-short")
    assert Client().get("/api/timeline/", **short).json()["error"]["code"] == "not_authenticated"


def test_a_nonce_is_remembered_until_its_timestamp_leaves_the_window(make_device: Any, settings: Any) -> None:
    device = make_device().device
    stamp = 1_900_000_000
    window = settings.HTTP_SIGNATURE_MAX_SKEW_SECONDS

    def at(seconds: int) -> datetime:
        return datetime.fromtimestamp(seconds, tz=UTC)

    accept_request_nonce(device, "n" * 16, stamp, now=at(stamp - window))  # sent from a clock that runs ahead
    with pytest.raises(YimiError) as replay:
        accept_request_nonce(device, "n" * 16, stamp, now=at(stamp + window))  # the last second it could pass
    assert replay.value.code == "request_replayed"
    accept_request_nonce(device, "m" * 16, stamp + 2 * window, now=at(stamp + window + 1))
    assert list(SignedRequestNonce.objects.values_list("nonce", flat=True)) == ["m" * 16]  # the first one is forgotten


def test_revoked_device_cannot_read(make_device: Any) -> None:
    from accounts.devices import revoke_device

    sim = make_device()
    revoke_device(sim.device)
    assert signed_get(sim, "/api/timeline/").json()["error"]["code"] == "not_authenticated"


def test_owner_reads_the_timeline_from_a_browser_session(owner: Any) -> None:
    append_entry(owner_id=owner.id, kind="notice", text="hello")
    client = Client()
    client.force_login(owner)
    assert [e["text"] for e in client.get("/api/timeline/").json()["entries"]] == ["hello"]


def test_bad_query_parameters_get_a_stable_error(make_device: Any) -> None:
    sim = make_device()
    assert signed_get(sim, "/api/timeline/?after=abc").json()["error"]["code"] == "invalid_request"
    assert signed_get(sim, "/api/timeline/?after=-1").json()["error"]["code"] == "invalid_request"
