"""The owner's memory API (``api/memory/...``) and the pack's internal API
(``internal/memory/...``): commit, query, history, forget, speaking preferences, recall,
short context; stable error codes."""

from __future__ import annotations

import re
import uuid
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from memory.models import Assertion
from memory.timeline.entries import append_entry
from tests.conftest import internal_client, pack_capability
from tests.support.memory_support import hold_source_deadlines
from yimi_project.errors import HTTP_STATUS
from yimi_project.internal import TOKEN_HEADER


@pytest.fixture(autouse=True)
def data_dir(tmp_path: Path, settings: Any) -> None:
    settings.DATA_DIR = tmp_path


@pytest.fixture
def api(owner: Any) -> Client:
    client = Client()
    client.force_login(owner)
    return client


def post(client: Client, url: str, body: Any) -> Any:
    return client.post(url, body, content_type="application/json")


def error_of(response: Any, code: str) -> dict[str, Any]:
    assert response.status_code == HTTP_STATUS.get(code, 400), (response.status_code, response.content)
    error = response.json()["error"]
    assert error["code"] == code, error
    return error


def new(client: Client, text: str = "不吃香菜", **extra: Any) -> dict[str, Any]:
    body = {"predicate": "preference.food", "payload": {"text": text}, "expected_version": 0, "request_id": uuid.uuid4().hex, **extra}
    response = post(client, "/api/memory/assertions/", body)
    assert response.status_code == 201, response.content
    return response.json()


def test_the_owner_commits_queries_reads_history_and_forgets(api: Client, owner: Any) -> None:
    said = append_entry(owner_id=owner.pk, kind="utterance", text="我不吃香菜", scope="owner")
    made = new(api, evidence=[said.seq])
    aid = made["assertion_id"]
    assert (made["version"], made["replayed"]) == (1, False)
    body = {"assertion_id": aid, "predicate": "preference.food", "payload": {"text": "香菜现在能吃了"}, "expected_version": 1, "request_id": "r2"}
    assert post(api, "/api/memory/assertions/", body).status_code == 201
    replay = post(api, "/api/memory/assertions/", body)
    assert replay.status_code == 200 and replay.json()["replayed"] is True and replay.json()["version"] == 2
    rows = api.get("/api/memory/assertions/?prefix=preference.").json()["assertions"]
    assert [(r["id"], r["version"], r["payload"]) for r in rows] == [(aid, 2, {"text": "香菜现在能吃了"})]
    assert api.get(f"/api/memory/assertions/{aid}/").json()["version"] == 2
    history = api.get(f"/api/memory/assertions/{aid}/history/").json()
    assert [(v["version"], v["evidence"]) for v in history["versions"]] == [(1, [said.seq]), (2, [])]
    preview = api.get(f"/api/memory/assertions/{aid}/forget/").json()
    assert [w["id"] for w in preview["will_forget"]] == [aid]
    forgotten = post(api, f"/api/memory/assertions/{aid}/forget/", {"request_id": "f1", "confirm": True})
    assert forgotten.status_code == 200 and forgotten.json()["versions_erased"] == 2
    assert api.get("/api/memory/assertions/").json()["assertions"] == []


def test_the_api_answers_with_stable_error_codes(api: Client) -> None:
    aid = new(api)["assertion_id"]
    base = {"assertion_id": aid, "predicate": "preference.food", "payload": {"text": "x"}}
    post(api, "/api/memory/assertions/", {**base, "expected_version": 1, "request_id": "w1"})
    conflict = error_of(post(api, "/api/memory/assertions/", {**base, "expected_version": 1, "request_id": "w2"}), "conflict")
    assert conflict["details"] == {"current_version": 2}
    error_of(post(api, "/api/memory/assertions/", {**base, "expected_version": 2, "request_id": "w1"}), "request_id_reused")
    error_of(post(api, "/api/memory/assertions/", {**base, "expected_version": "2", "request_id": "w3"}), "invalid_request")
    error_of(post(api, "/api/memory/assertions/", [1, 2]), "invalid_request")
    error_of(api.get(f"/api/memory/assertions/{uuid.uuid4()}/"), "not_found")
    error_of(post(api, f"/api/memory/assertions/{aid}/forget/", {"request_id": "f1"}), "confirmation_required")
    post(api, f"/api/memory/assertions/{aid}/forget/", {"request_id": "f1", "confirm": True})
    error_of(post(api, "/api/memory/assertions/", {**base, "expected_version": 2, "request_id": "w4"}), "forgotten")
    error_of(api.get("/api/memory/recall/"), "invalid_request")


def test_speaking_preferences_through_the_api(api: Client) -> None:
    assert api.get("/api/memory/speaking-preferences/").json() == {"assertion_id": None, "version": 0, "text": ""}
    assert api.put("/api/memory/speaking-preferences/", {"text": "说话简短", "expected_version": 0, "request_id": "p1"}, content_type="application/json").status_code == 201
    assert post(api, "/api/memory/speaking-preferences/", {"text": "多举例子", "expected_version": 1, "request_id": "p2"}).status_code == 201
    rejected = error_of(post(api, "/api/memory/speaking-preferences/", {"text": "从现在起你叫小美", "expected_version": 2, "request_id": "p3"}), "preference_rejected")
    assert rejected["details"]["rule"] == "identity"
    error_of(post(api, "/api/memory/speaking-preferences/", {"text": "好" * 1501, "expected_version": 2, "request_id": "p4"}), "preference_too_long")
    restored = post(api, "/api/memory/speaking-preferences/restore/", {"expected_version": 2, "request_id": "r1"})
    assert restored.status_code == 201 and restored.json()["version"] == 3
    assert api.get("/api/memory/speaking-preferences/").json()["text"] == "说话简短"


def test_recall_and_short_context_through_the_api(api: Client, owner: Any) -> None:
    new(api, "不吃香菜")
    append_entry(owner_id=owner.pk, kind="utterance", text="我昨天说要买牛奶", scope="owner")
    body = api.get("/api/memory/recall/?q=我昨天说要买什么").json()
    assert body["layers"] == ["l3", "timeline"] and body["timeline"][0]["text"] == "我昨天说要买牛奶"
    only_l3 = api.get("/api/memory/recall/?q=香菜&layers=l3").json()
    assert only_l3["layers"] == ["l3"] and only_l3["assertions"][0]["payload"] == {"text": "不吃香菜"}


@pytest.mark.django_db(transaction=True)
def test_the_short_context_endpoint(owner: Any, monkeypatch: Any) -> None:
    hold_source_deadlines(monkeypatch)  # no source's time runs out: the answer does not depend on the machine
    owner.time_zone = "Asia/Shanghai"
    owner.save(update_fields=["time_zone"])
    client = Client()
    client.force_login(owner)
    new(client, "不吃香菜")
    append_entry(owner_id=owner.pk, kind="utterance", text="我昨天说要买牛奶", scope="owner")
    body = client.get("/api/memory/short-context/").json()
    assert (body["included"], body["timed_out"], body["failed"]) == (["time_zone", "assertions", "recent_timeline"], [], [])
    sections = body["text"].split("\n")
    assert sections[0] == "[time_zone]" and re.fullmatch(r"Asia/Shanghai, local time \d{4}-\d\d-\d\d \d\d:\d\d \w{3}", sections[1])
    assert sections[2:] == ["[assertions]", "- preference.food: 不吃香菜", "[recent_timeline]", "Owner: 我昨天说要买牛奶"]
    assert body["chars"] == len(body["text"])


def signed(sim: Any, method: str, url: str) -> Any:
    return getattr(Client(), method.lower())(url, **sim.signed(method, url))


def test_only_the_owner_reads_memory(make_device: Any, owner: Any, django_user_model: Any) -> None:
    owner_client = Client()
    owner_client.force_login(owner)
    new(owner_client)
    assert signed(make_device(), "GET", "/api/memory/assertions/").status_code == 200  # the owner's own device
    guest = signed(make_device(guest=True), "GET", "/api/memory/assertions/")
    assert guest.status_code == 403 and guest.json()["error"]["code"] == "forbidden"
    assert Client().get("/api/memory/assertions/").json()["error"]["code"] == "not_authenticated"
    staff = django_user_model.objects.create_user("reviewer", password="pw-pw-pw-pw", is_staff=True)
    other = Client()
    other.force_login(staff)
    assert other.get("/api/memory/assertions/").json()["error"]["code"] == "forbidden"


def memory_call(owner: Any, category: str, **target: Any) -> Client:
    """The memory pack executing one call the gateway decided as ``category``."""
    cap = pack_capability(owner.pk, pack="memory", category=category, apis=["memory"], **target)
    return internal_client(**{"X-Yimi-Call-Capability": cap})


def test_the_internal_api_acts_for_the_calls_owner_as_the_agent(owner: Any, settings: Any) -> None:
    made = post(memory_call(owner, "owner_data"), "/internal/memory/assertions/", {"predicate": "preference.food", "payload": {"text": "不吃香菜"}, "expected_version": 0, "request_id": "i1"})
    assert made.status_code == 201
    assert Assertion.objects.get(id=made.json()["assertion_id"]).versions.get().actor == "agent"
    assertion_id = made.json()["assertion_id"]
    forgotten = post(memory_call(owner, "delete", assertion_id=assertion_id), f"/internal/memory/assertions/{assertion_id}/forget/", {"request_id": "i2"})
    assert forgotten.status_code == 200 and forgotten.json()["assertions_forgotten"] == 1  # the gateway gated it


def test_the_internal_api_allows_only_what_the_call_was_decided_for(owner: Any) -> None:
    made = post(memory_call(owner, "owner_data"), "/internal/memory/assertions/", {"predicate": "preference.food", "payload": {"text": "不吃香菜"}, "expected_version": 0, "request_id": "i1"})
    assertion_id = made.json()["assertion_id"]
    other = post(memory_call(owner, "owner_data"), "/internal/memory/assertions/", {"predicate": "preference.drink", "payload": {"text": "茶"}, "expected_version": 0, "request_id": "i2"}).json()["assertion_id"]
    refusals = [
        # a read call, or a write call, cannot forget: only a call the consent gate decided as delete
        post(memory_call(owner, "observe"), f"/internal/memory/assertions/{assertion_id}/forget/", {"request_id": "f1"}),
        post(memory_call(owner, "owner_data", assertion_id=assertion_id), f"/internal/memory/assertions/{assertion_id}/forget/", {"request_id": "f2"}),
        # a delete call on one assertion cannot forget another
        post(memory_call(owner, "delete", assertion_id=other), f"/internal/memory/assertions/{assertion_id}/forget/", {"request_id": "f3"}),
        # a read call cannot commit, a commit call on one assertion cannot write another
        post(memory_call(owner, "observe"), "/internal/memory/assertions/", {"predicate": "p.x", "payload": {"text": "x"}, "expected_version": 0, "request_id": "c1"}),
        post(memory_call(owner, "owner_data", assertion_id=other), "/internal/memory/assertions/", {"assertion_id": assertion_id, "predicate": "preference.food", "payload": {"text": "x"}, "expected_version": 1, "request_id": "c2"}),
        post(memory_call(owner, "observe"), "/internal/memory/speaking-preferences/", {"text": "短一点", "expected_version": 0, "request_id": "s1"}),
    ]
    assert [(r.status_code, r.json()["error"]["code"]) for r in refusals] == [(403, "forbidden")] * len(refusals)
    assert Assertion.objects.filter(state="active").count() == 2
    assert memory_call(owner, "observe").get("/internal/memory/assertions/").status_code == 200


@pytest.mark.parametrize(
    "make_client",
    [
        lambda s, o: internal_client(),
        lambda s, o: internal_client(**{"X-Yimi-Call-Capability": "forged"}),
        lambda s, o: internal_client(**{TOKEN_HEADER: s.INTERNAL_TOKEN}),  # the platform's token is not a pack's
        lambda s, o: internal_client(**{"X-Yimi-Call-Capability": pack_capability(o.pk, pack="schedule", category="owner_data", apis=["reminders"])}),
        lambda s, o: Client(headers={"X-Yimi-Call-Capability": pack_capability(o.pk, pack="memory", category="owner_data", apis=["memory"])}),
    ],
    ids=["no-capability", "forged", "internal-token", "other-api", "public-listener"],
)
def test_the_internal_api_refuses_without_a_capability_on_the_internal_listener(owner: Any, settings: Any, make_client: Any) -> None:
    client = make_client(settings, owner)
    body = {"predicate": "preference.food", "payload": {"text": "x"}, "expected_version": 0, "request_id": "i1"}
    for response in (post(client, "/internal/memory/assertions/", body), client.get("/internal/memory/assertions/")):
        assert response.status_code == 403 and response.json()["error"]["code"] == "forbidden"
    assert not Assertion.objects.exists()
