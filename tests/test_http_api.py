from __future__ import annotations

import time
from typing import Any

import pytest
from django.test import Client

from devices.signatures import http_message
from memory.services import append_entry

pytestmark = pytest.mark.django_db


def signed_get(sim: Any, path: str, *, ts: int | None = None, sign_path: str | None = None) -> Any:
    stamp = str(ts if ts is not None else int(time.time()))
    sig = sim.sign(http_message("GET", sign_path or path, stamp, b""))
    return Client().get(path, HTTP_X_YIMI_DEVICE=str(sim.device.id), HTTP_X_YIMI_TIMESTAMP=stamp, HTTP_X_YIMI_SIGNATURE=sig)


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


def test_revoked_device_cannot_read(make_device: Any) -> None:
    from devices.services import revoke_device

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
