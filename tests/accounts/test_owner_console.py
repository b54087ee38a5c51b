"""The owner console: everything Yimi did is auditable (runs with their sentence, reply and
receipts; the receipt ledger; sub-agent tasks; reminders), memory is edited through a form
that commits with compare-and-set, devices are readable, and the HTTP API has an OpenAPI 3
schema. Each page: the owner sees it, a second superuser gets 403."""

from __future__ import annotations

import re
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.test import Client
from django.utils import timezone
from drf_spectacular.validation import validate_schema

from accounts.devices import revoke_device
from accounts.owner_admin import clip
from brain.models import AgentTask, Run
from brain.services import accept_utterance
from capabilities.models import ReceiptRecord, ToolCall
from memory.assertions import preferences
from memory.assertions import store as assertions
from memory.assertions.store import CommitRequest
from memory.models import Assertion, AssertionVersion, TimelineEntry
from schedules import reminders

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def data_dir(tmp_path: Path, settings: Any) -> None:
    settings.DATA_DIR = tmp_path


def logged_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def second_superuser(django_user_model: Any) -> Any:
    return django_user_model.objects.create_superuser("second-admin", password="pw-pw-pw-pw")


def believe(owner: Any, text: str, predicate: str = "preference.food") -> str:
    return assertions.commit(
        CommitRequest(owner_id=owner.pk, request_id=uuid.uuid4().hex, predicate=predicate, payload={"text": text},
                      expected_version=0, actor="agent")
    ).assertion_id


def audited_run(owner: Any, make_device: Any) -> Run:
    said = accept_utterance(make_device().device, "c-console", "book a table for two tonight")
    run = Run.objects.get(id=said.run_id)
    reply = TimelineEntry.objects.create(owner=owner, seq=said.entry.seq + 1, kind="assistant", text="Booked: 19:30, table for two.")
    Run.objects.filter(id=run.id).update(result_entry=reply, state=Run.State.SUCCEEDED)
    call = ToolCall.objects.create(owner=owner, run=run, tool="restaurant__book", category="act", fingerprint="f" * 64,
                                   idempotency_key="k", decision="allow")
    ReceiptRecord.objects.create(owner=owner, call=call, task_id="t-1", status="succeeded",
                                 receipt={"summary": "table 12 held until 19:45"}, content_fingerprint="c" * 64)
    AgentTask.objects.create(run=run, goal="find a quiet restaurant nearby", state="succeeded", result="Chez Ami")
    return run


def test_a_run_shows_its_sentence_scope_reply_and_receipts(owner: Any, make_device: Any) -> None:
    run = audited_run(owner, make_device)
    mine = logged_in(owner)
    listing = mine.get("/admin/brain/run/").content.decode()
    assert "book a table for two tonight" in listing and "Booked: 19:30" in listing and run.scope in listing
    page = mine.get(f"/admin/brain/run/{run.id}/change/").content.decode()
    assert "book a table for two tonight" in page and "Booked: 19:30, table for two." in page
    assert "restaurant__book" in page and "table 12 held until 19:45" in page and "find a quiet restaurant nearby" in page


def test_the_ledger_tasks_and_reminders_have_owner_pages(owner: Any, make_device: Any, second_superuser: Any) -> None:
    run = audited_run(owner, make_device)
    reminder, _ = reminders.create_reminder(owner, "take the umbrella", (timezone.now() + timedelta(hours=1)).isoformat())
    call = ToolCall.objects.get(run=run)
    task = AgentTask.objects.get(run=run)
    pages = {
        "/admin/capabilities/toolcall/": "restaurant__book",
        f"/admin/capabilities/toolcall/{call.id}/change/": "table 12 held until 19:45",
        "/admin/capabilities/receiptrecord/": "table 12 held until 19:45",
        "/admin/brain/agenttask/": "find a quiet restaurant nearby",
        f"/admin/brain/agenttask/{task.id}/change/": "Chez Ami",
        "/admin/schedules/reminder/": "take the umbrella",
        f"/admin/schedules/reminder/{reminder.id}/change/": "take the umbrella",
    }
    mine, staff = logged_in(owner), logged_in(second_superuser)
    for url, shown in pages.items():
        response = mine.get(url)
        assert response.status_code == 200 and shown in response.content.decode(), url
        assert staff.get(url).status_code == 403, url
    # read-only: the services are the only writers
    assert mine.post(f"/admin/capabilities/receiptrecord/{ReceiptRecord.objects.get().pk}/delete/", {"post": "yes"}).status_code == 403
    assert ReceiptRecord.objects.count() == 1


def test_the_memory_form_commits_a_new_version_and_refuses_a_stale_one(owner: Any) -> None:
    a = believe(owner, "不吃香菜")
    mine = logged_in(owner)
    form = mine.get(f"/admin/memory/assertion/{a}/change/").content.decode()
    assert 'name="text"' in form and "不吃香菜" in form and 'name="payload"' not in form
    saved = mine.post(f"/admin/memory/assertion/{a}/change/", {"text": "香菜现在能吃了", "expected_version": "1"})
    assert saved.status_code == 302
    assert AssertionVersion.objects.get(assertion_id=a, version=2).payload == {"text": "香菜现在能吃了"}
    stale = mine.post(f"/admin/memory/assertion/{a}/change/", {"text": "其实不能吃", "expected_version": "1"})
    body = stale.content.decode()
    assert stale.status_code == 200 and "changed while you were editing" in body and "now at version 2" in body
    assert "其实不能吃" in body  # the owner's text is kept for the retry
    assert Assertion.objects.get(id=a).current_version == 2


def test_the_forget_preview_then_confirm_forgets(owner: Any) -> None:
    a = believe(owner, "secret hobby")
    mine = logged_in(owner)
    preview = mine.get(f"/admin/memory/assertion/{a}/forget/").content.decode()
    assert "secret hobby" in preview and Assertion.objects.get(id=a).state == "active"
    mine.post(f"/admin/memory/assertion/{a}/forget/", {"confirm": "yes"})
    assert Assertion.objects.get(id=a).state == "forgotten"


def test_speaking_preferences_have_versions_and_restore(owner: Any, second_superuser: Any) -> None:
    mine = logged_in(owner)
    url = "/admin/memory/assertion/speaking-preferences/"
    mine.post(url, {"text": "Speak briefly.", "expected_version": "0"})
    mine.post(url, {"text": "Speak warmly and briefly.", "expected_version": "1"})
    assert preferences.current(owner.pk)["text"] == "Speak warmly and briefly."
    page = mine.get(url).content.decode()
    assert page.count('class="speaking-version"') == 2 and "Speak briefly." in page
    mine.post(url, {"restore": "yes", "expected_version": "2"})
    assert preferences.current(owner.pk) == {**preferences.current(owner.pk), "version": 3, "text": "Speak briefly."}
    stale = mine.post(url, {"text": "x", "expected_version": "1"}, follow=True).content.decode()
    assert "conflict" in stale and preferences.current(owner.pk)["version"] == 3
    assert logged_in(second_superuser).get(url).status_code == 403


def test_devices_are_listed_readably_with_a_revoked_filter(owner: Any, make_device: Any) -> None:
    kept = make_device(name="kitchen phone").device
    gone = make_device(name="old watch phone").device
    revoke_device(gone)
    mine = logged_in(owner)
    everything = mine.get("/admin/accounts/device/").content.decode()
    assert "kitchen phone" in everything and "old watch phone" in everything and "last seen" in everything.lower()
    in_use = mine.get("/admin/accounts/device/?revoked=no").content.decode()
    assert "kitchen phone" in in_use and "old watch phone" not in in_use
    assert "old watch phone" in mine.get("/admin/accounts/device/?revoked=yes").content.decode()
    assert kept.name == "kitchen phone"


def test_a_taken_device_name_becomes_name_2_at_pairing(make_device: Any) -> None:
    assert make_device(name="phone").device.name == "phone"
    assert make_device(name="phone").device.name == "phone 2"
    assert make_device(name="phone").device.name == "phone 3"


def test_list_text_is_cut_on_a_word_or_cjk_boundary_with_an_ellipsis() -> None:
    assert clip("the quick brown fox jumps over the lazy dog", 22) == "the quick brown fox…"
    assert clip("我想明天早上八点叫我起床然后提醒我带伞", 10) == "我想明天早上八点叫我…"
    assert clip("short", 10) == "short"


def test_the_timeline_list_truncates_with_an_ellipsis(owner: Any) -> None:
    TimelineEntry.objects.create(owner=owner, seq=1, kind="user", text="word " * 40 + "lasttail")
    page = logged_in(owner).get("/admin/memory/timelineentry/").content.decode()
    assert "word word…" in page and "lasttail" not in page


def test_a_timeline_entry_links_to_the_run_that_answered_it(owner: Any, make_device: Any) -> None:
    run = audited_run(owner, make_device)
    run.refresh_from_db()
    reply = run.result_entry
    TimelineEntry.objects.filter(pk=reply.pk).update(reply_to=run.inbound)
    alone = TimelineEntry.objects.create(owner=owner, seq=reply.seq + 1, kind="notice", text="the cold pack was sealed")
    mine = logged_in(owner)
    listing = mine.get("/admin/memory/timelineentry/").content.decode()
    link = f'<a class="run-link" href="/admin/brain/run/{run.id}/change/">run {str(run.id)[:8]}</a>'
    assert listing.count(link) == 2  # the utterance that started it and the reply it gave
    for entry in (run.inbound, reply):
        assert link in mine.get(f"/admin/memory/timelineentry/{entry.pk}/change/").content.decode()
    assert "run-link" not in mine.get(f"/admin/memory/timelineentry/{alone.pk}/change/").content.decode()


def test_the_model_settings_sit_in_the_models_section_of_the_index(owner: Any) -> None:
    index = logged_in(owner).get("/admin/").content.decode()
    models = index[index.index('class="app-task-models'):]
    models = models[: models.index("</table>")]
    assert "/admin/llm/modelrole/" in models and "/admin/llm/modelselection/" in models
    assert "/admin/brain/run/" not in models  # runs are with the timeline, what Yimi did


def test_the_api_schema_is_openapi_3_and_lists_the_device_and_memory_endpoints(owner: Any, second_superuser: Any) -> None:
    mine = logged_in(owner)
    response = mine.get("/api/schema/")
    assert response.status_code == 200
    schema = yaml.safe_load(response.content)
    validate_schema(schema)  # drf-spectacular's bundled OpenAPI 3 JSON Schema, checked by jsonschema
    assert schema["openapi"].startswith("3.")
    for path in ("/api/pair/", "/api/timeline/", "/api/memory/assertions/", "/api/memory/assertions/{id}/forget/",
                 "/api/memory/speaking-preferences/"):
        assert path in schema["paths"], path
    assert not any(p.startswith("/internal/") for p in schema["paths"])
    assert_bodies_are_described(schema)
    docs = mine.get("/api/docs/")
    assert docs.status_code == 200 and b"swagger-ui" in docs.content
    # Swagger UI's files are served from here (the sidecar), none from a CDN. Not "no 'cdn'
    # anywhere in the page": the page's random CSRF token sometimes holds those letters.
    sources = re.findall(rb'(?:src|href)="([^"]+)"', docs.content)
    assert sources and all(s.startswith(b"/static/") for s in sources), sources
    assert re.search(rb"https?://", docs.content) is None
    assert logged_in(second_superuser).get("/api/schema/").status_code == 403
    assert Client().get("/api/schema/").status_code == 302  # to the admin login


def _body_schema(schema: dict[str, Any], part: dict[str, Any]) -> dict[str, Any]:
    """The JSON schema of a request body or response (refs followed), JSON as the only media type."""
    content = part["content"]
    assert list(content) == ["application/json"], list(content)
    ref = content["application/json"]["schema"]["$ref"]
    return schema["components"]["schemas"][ref.rsplit("/", 1)[1]]


def assert_bodies_are_described(schema: dict[str, Any]) -> None:
    """Every operation under /api/ has its success body and the error body
    (``{"error": {"code", "message", "details"?}}``, yimi_project.api) with the codes its
    statuses carry; the request bodies name the fields the services read."""
    error = schema["components"]["schemas"]["ErrorBody"]
    assert error["required"] == ["error"]
    detail = schema["components"]["schemas"]["ErrorDetail"]
    assert set(detail["properties"]) == {"code", "message", "details"} and set(detail["required"]) == {"code", "message"}
    paths = schema["paths"]
    for path, operations in paths.items():
        for method, op in operations.items():
            if method == "parameters" or path in ("/api/schema/", "/api/docs/"):
                continue
            ok = [s for s in op["responses"] if s.startswith("2")]
            assert ok and _body_schema(schema, op["responses"][ok[0]])["properties"], (path, method)
            failures = [s for s in op["responses"] if s[0] in "45"]
            assert failures, (path, method)
            for status in failures:
                assert op["responses"][status]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorBody")
                assert "error code: `" in op["responses"][status]["description"]
    pair = paths["/api/pair/"]["post"]
    request = _body_schema(schema, pair["requestBody"])
    assert set(request["properties"]) == {"code", "kind", "name", "capture_channels", "public_key", "signature", "relay_via"}
    assert set(request["required"]) == {"code", "kind", "name", "public_key", "signature"}
    assert set(_body_schema(schema, pair["responses"]["201"])["properties"]) == {
        "device_id", "kind", "name", "guest", "instance_public_key", "protocol"}
    assert "`code_expired`" in pair["responses"]["400"]["description"] and "`rate_limited`" in pair["responses"]["429"]["description"]
    assert "`bad_signature`" in pair["responses"]["401"]["description"]
    page = _body_schema(schema, paths["/api/timeline/"]["get"]["responses"]["200"])
    assert set(page["properties"]) == {"after", "entries", "next_after", "has_more"}
    assert {p["name"] for p in paths["/api/timeline/"]["get"]["parameters"]} >= {"after", "limit"}
    commit = paths["/api/memory/assertions/"]["post"]
    assert set(_body_schema(schema, commit["requestBody"])["properties"]) == {
        "assertion_id", "expected_version", "predicate", "payload", "evidence", "depends_on", "request_id"}
    assert {"200", "201", "409", "410"} <= set(commit["responses"])
    assert "`conflict`" in commit["responses"]["409"]["description"] and "`forgotten`" in commit["responses"]["410"]["description"]
    forget = paths["/api/memory/assertions/{id}/forget/"]
    assert set(_body_schema(schema, forget["post"]["requestBody"])["properties"]) == {"request_id", "confirm"}
    assert "will_forget" in _body_schema(schema, forget["get"]["responses"]["200"])["properties"]
    assert "`confirmation_required`" in forget["post"]["responses"]["409"]["description"]
    restore = paths["/api/memory/speaking-preferences/restore/"]["post"]
    assert "`nothing_to_restore`" in restore["responses"]["409"]["description"]
