"""The one JSON guard (``yimi_project/jsonbody.py``) on every HTTP endpoint that reads JSON
— the anonymous pairing endpoint, the owner's memory API, the internal gateway (which
carries model-written arguments) — and the websocket's first frames and gesture frames
(docs/protocol.md).

Each refused body would otherwise have been accepted (a valid request apart from the
one bad string or the nesting), so a refusal here is the guard's, and the database
is compared whole before and after: a refusal changes nothing."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from django.apps import apps
from django.test import Client

from accounts.devices import issue_pairing_code
from accounts.models import Device
from brain.models import Run
from capabilities.models import ToolCall
from memory.models import TimelineEntry
from tests.capabilities.test_gateway_queries import post as asgi_post
from tests.conftest import db_async, internal_client, open_socket, pack_capability, pairing_payload
from tests.support.gateway_support import run_with_demo_pack
from yimi_project import call_capability, jsonbody
from yimi_project.errors import YimiError
from yimi_project.internal import TOKEN_HEADER

pytestmark = pytest.mark.django_db(transaction=True)

# JSON values nested, as the value of a field of the body (one more level): one past the
# guard's limit, and far past Python's own recursion limit (where the parser itself gives up
# with a RecursionError: a 500 before the guard).
JUST_TOO_DEEP = '{"a": ' * jsonbody.MAX_DEPTH + "1" + "}" * jsonbody.MAX_DEPTH
FAR_TOO_DEEP = "[" * 5000 + "]" * 5000

# (reason, a JSON string literal holding it), written as the client sends it: escaped.
BAD_STRINGS = [
    pytest.param("nul", r'"pho\u0000ne"', id="nul"),
    pytest.param("lone_surrogate", r'"pho\ud800ne"', id="lone-high-surrogate"),
    pytest.param("lone_surrogate", r'"\udfffphone"', id="lone-low-surrogate"),
]
DEEP_VALUES = [pytest.param(JUST_TOO_DEEP, id="33-deep"), pytest.param(FAR_TOO_DEEP, id="5000-deep")]


def rows() -> dict[str, int]:
    """How many rows every table holds: a refusal must leave all of them as they were."""
    return {model._meta.label: model._default_manager.count() for model in apps.get_models()}


def with_field(body: dict[str, Any], field: str, raw_json: str) -> bytes:
    """``body`` as JSON text with ``field`` set to the raw JSON text ``raw_json``."""
    marker = "\u2603marker\u2603"
    return json.dumps({**body, field: marker}).replace(json.dumps(marker), raw_json).encode()


def refused(response_status: int, payload: dict[str, Any], reason: str) -> None:
    assert response_status == 400, (response_status, payload)
    assert payload["error"]["code"] == "invalid_request", payload
    assert payload["error"]["details"]["reason"] == reason, payload


# --- the guard itself ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "code", "reason"),
    [
        (rb'{"a": "x\u0000"}', "invalid_request", "nul"),
        (rb'{"a\u0000": 1}', "invalid_request", "nul"),  # keys too
        (rb'{"a": ["\ud800"]}', "invalid_request", "lone_surrogate"),
        (rb'{"a": "\udc00\ud800"}', "invalid_request", "lone_surrogate"),  # reversed: not a pair
        (('{"x": ' + JUST_TOO_DEEP + "}").encode(), "invalid_request", "too_deep"),
        (FAR_TOO_DEEP.encode(), "invalid_request", "too_deep"),
        (b'{"a": 1e400}', "invalid_request", "number_out_of_range"),
        (b'{"a": NaN}', "malformed_json", None),
        (b'{"a": -Infinity}', "malformed_json", None),
        (b'{"a": "x\x00"}', "malformed_json", None),  # a raw NUL is not JSON
        (b'{"a": "\xed\xa0\x80"}', "malformed_json", None),  # a raw surrogate is not UTF-8
        (b"\xff\xfe{}", "malformed_json", None),
        (b"{nope", "malformed_json", None),
    ],
)
def test_parse_refuses_with_a_stable_code_and_reason(raw: bytes, code: str, reason: str | None) -> None:
    with pytest.raises(YimiError) as refusal:
        jsonbody.parse(raw)
    assert refusal.value.code == code
    assert refusal.value.details.get("reason") == reason
    assert refusal.value.http_status == 400


def test_parse_keeps_what_is_clean() -> None:
    at_the_limit = '{"a": ' * (jsonbody.MAX_DEPTH - 1) + "[]" + "}" * (jsonbody.MAX_DEPTH - 1)
    assert jsonbody.parse(at_the_limit.encode()) is not None
    assert jsonbody.parse(rb'{"smile": "\ud83d\ude00", "n": 1e300}') == {"smile": "\U0001F600", "n": 1e300}  # a pair is one character
    assert jsonbody.parse(b"") == {}
    assert jsonbody.parse(b"[1]") == [1]


def test_parse_refuses_a_body_over_the_limit(settings: Any) -> None:
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 100
    assert jsonbody.parse(json.dumps({"a": "x" * 80}).encode()) == {"a": "x" * 80}
    with pytest.raises(YimiError) as refusal:
        jsonbody.parse(json.dumps({"a": "x" * 100}).encode())
    assert (refusal.value.code, refusal.value.http_status, refusal.value.details["limit"]) == ("payload_too_large", 413, 100)


# --- POST /api/pair/ (anonymous) ----------------------------------------------------------------


@pytest.fixture
def pairing(owner: Any) -> dict[str, Any]:
    """A pairing body that pairs a phone, as it is."""
    _, code = issue_pairing_code(owner)
    body, _ = pairing_payload(code)
    return body


def pair(body: bytes) -> tuple[int, dict[str, Any]]:
    response = Client().post("/api/pair/", body, content_type="application/json")
    return response.status_code, response.json()


@pytest.mark.parametrize(("reason", "bad"), BAD_STRINGS)
def test_pairing_refuses_a_bad_string_and_changes_nothing(pairing: dict[str, Any], reason: str, bad: str) -> None:
    before = rows()
    refused(*pair(with_field(pairing, "name", bad)), reason)
    refused(*pair(with_field(pairing, "ignored_by_the_server", bad)), reason)  # even where nobody reads it
    assert rows() == before
    status, paired = pair(json.dumps(pairing).encode())  # the code is still good
    assert status == 201 and paired["name"] == "test phone"


@pytest.mark.parametrize("deep", DEEP_VALUES)
def test_pairing_refuses_deep_nesting_and_changes_nothing(pairing: dict[str, Any], deep: str) -> None:
    before = rows()
    refused(*pair(with_field(pairing, "x", deep)), "too_deep")
    assert rows() == before
    assert Device.objects.count() == 0


def test_pairing_refuses_a_form_body_and_a_json_list(pairing: dict[str, Any]) -> None:
    before = rows()
    response = Client().post("/api/pair/", pairing)  # multipart: the API takes JSON only
    assert (response.status_code, response.json()["error"]["code"]) == (415, "invalid_request")
    assert pair(json.dumps([pairing]).encode()) == (400, {"error": {"code": "invalid_request", "message": "expected a JSON object"}})
    assert rows() == before


def test_a_body_over_djangos_limit_is_413_payload_too_large(pairing: dict[str, Any], settings: Any) -> None:
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    before = rows()
    status, payload = pair(json.dumps({**pairing, "padding": "x" * 2000}).encode())
    assert (status, payload["error"]["code"], payload["error"]["details"]["limit"]) == (413, "payload_too_large", 1000)
    assert rows() == before


# --- the owner's memory API: the six JSON write endpoints ---------------------------------------------


@pytest.fixture
def api(owner: Any, tmp_path: Path, settings: Any) -> Client:
    settings.DATA_DIR = tmp_path
    client = Client()
    client.force_login(owner)
    return client


def commit_body(text: str = "不吃香菜") -> dict[str, Any]:
    return {"predicate": "preference.food", "payload": {"text": text}, "expected_version": 0, "request_id": uuid.uuid4().hex}


def send(client: Client, method: str, path: str, body: bytes) -> tuple[int, dict[str, Any]]:
    response = getattr(client, method)(path, body, content_type="application/json")
    return response.status_code, response.json()


@pytest.mark.parametrize(("reason", "bad"), BAD_STRINGS)
def test_an_assertion_with_a_bad_string_is_refused_and_nothing_is_stored(api: Client, reason: str, bad: str) -> None:
    before = rows()
    body = commit_body()
    refused(*send(api, "post", "/api/memory/assertions/", with_field(body, "payload", '{"text": ' + bad + "}")), reason)
    refused(*send(api, "post", "/api/memory/assertions/", with_field(body, "predicate", bad)), reason)
    assert rows() == before
    assert send(api, "post", "/api/memory/assertions/", json.dumps(body).encode())[0] == 201


def write_endpoints(client: Client) -> list[tuple[str, str, dict[str, Any]]]:
    """The six JSON write endpoints of the public API, each with a body it accepts."""
    status, made = send(client, "post", "/api/memory/assertions/", json.dumps(commit_body("kept")).encode())
    assert status == 201, made
    preference = {"text": "说话简短一点", "expected_version": 0, "request_id": uuid.uuid4().hex}
    return [
        ("post", "/api/memory/assertions/", commit_body()),
        ("post", f"/api/memory/assertions/{made['assertion_id']}/forget/", {"request_id": "f1", "confirm": True}),
        ("put", "/api/memory/speaking-preferences/", preference),
        ("post", "/api/memory/speaking-preferences/", preference),
        ("post", "/api/memory/speaking-preferences/restore/", {"expected_version": 0, "request_id": "r1"}),
    ]


@pytest.mark.parametrize("deep", DEEP_VALUES)
def test_every_json_write_endpoint_refuses_deep_nesting_and_changes_nothing(api: Client, pairing: dict[str, Any], deep: str) -> None:
    endpoints = write_endpoints(api)
    before = rows()
    refused(*pair(with_field(pairing, "x", deep)), "too_deep")
    for method, path, body in endpoints:
        status, payload = send(api, method, path, with_field(body, "x", deep))
        assert status == 400 and payload["error"].get("details", {}).get("reason") == "too_deep", (method, path, status, payload)
    assert rows() == before


@pytest.mark.parametrize(("reason", "bad"), BAD_STRINGS)
def test_every_json_write_endpoint_refuses_a_bad_string_and_changes_nothing(api: Client, reason: str, bad: str) -> None:
    endpoints = write_endpoints(api)
    before = rows()
    for method, path, body in endpoints:
        status, payload = send(api, method, path, with_field(body, "request_id", bad))
        assert status == 400 and payload["error"].get("details", {}).get("reason") == reason, (method, path, status, payload)
    assert rows() == before


@pytest.mark.parametrize(
    "path",
    ["/api/memory/assertions/?q=a%00b", "/api/memory/recall/?q=%00", "/api/timeline/?after=%00", "/api/memory/assertions/?pre%00fix=a"],
)
def test_a_nul_in_the_query_string_is_refused_before_any_view(api: Client, path: str) -> None:
    response = api.get(path)
    refused(response.status_code, response.json(), "nul")


# --- the internal gateway (model-written arguments) --------------------------------------------------


@pytest.fixture
def run(make_device: Any, tmp_path: Path, settings: Any) -> Run:
    return run_with_demo_pack(make_device().device, tmp_path, settings)


def decide_body(run: Run) -> dict[str, Any]:
    return {"run_id": str(run.id), "tool": "demo__read", "arguments": {"key": "k"}}


def gateway_both_ways(body: bytes, token: str) -> list[tuple[int, dict[str, Any]]]:
    """``decide`` on the internal listener: daphne's fast path (ASGI) and Django's view."""
    status, _, payload = asgi_post("/internal/gateway/decide/", body, token=token)
    response = internal_client(**{TOKEN_HEADER: token}).post("/internal/gateway/decide/", body, content_type="application/json")
    return [(status, payload), (response.status_code, response.json())]


@pytest.mark.parametrize(("reason", "bad"), BAD_STRINGS)
def test_the_gateway_refuses_model_written_arguments_with_a_bad_string(run: Run, settings: Any, reason: str, bad: str) -> None:
    before = rows()
    for field in ("key", "k\u00e9y"):
        arguments = '{"' + field + '": ' + bad + "}"
        for answer in gateway_both_ways(with_field(decide_body(run), "arguments", arguments), settings.INTERNAL_TOKEN):
            refused(*answer, reason)
    for answer in gateway_both_ways(with_field(decide_body(run), "arguments", "{" + bad + ': "v"}'), settings.INTERNAL_TOKEN):
        refused(*answer, reason)  # a bad key
    assert rows() == before
    assert ToolCall.objects.count() == 0


@pytest.mark.parametrize("deep", DEEP_VALUES)
def test_the_gateway_refuses_deep_arguments(run: Run, settings: Any, deep: str) -> None:
    before = rows()
    for answer in gateway_both_ways(with_field(decide_body(run), "arguments", '{"key": ' + deep + "}"), settings.INTERNAL_TOKEN):
        refused(*answer, "too_deep")
    assert rows() == before
    # and the same call, clean, is decided
    [(status, decided), _] = gateway_both_ways(json.dumps(decide_body(run)).encode(), settings.INTERNAL_TOKEN)
    assert status == 200 and decided["decision"] == "allow"


@pytest.mark.parametrize(("reason", "bad"), BAD_STRINGS)
def test_the_mac_relay_refuses_a_bad_string_before_anything_reaches_the_mac(owner: Any, reason: str, bad: str) -> None:
    """``POST /internal/mac/op/`` (the owner-mac pack; devices/mac/internal.py), not DRF."""
    capability = pack_capability(owner.pk, pack="owner-mac", category="observe", apis=["mac"], tool="owner-mac__read_file")
    client = internal_client(**{call_capability.HEADER: capability})
    before = rows()
    body = with_field({"kind": "read_file"}, "payload", '{"path": ' + bad + "}")
    response = client.post("/internal/mac/op/", body, content_type="application/json")
    refused(response.status_code, response.json(), reason)
    deep = with_field({"kind": "read_file"}, "payload", '{"path": "a.txt", "x": ' + FAR_TOO_DEEP + "}")
    response = client.post("/internal/mac/op/", deep, content_type="application/json")
    refused(response.status_code, response.json(), "too_deep")
    assert rows() == before


# --- the websocket -----------------------------------------------------------------------------------


@pytest.fixture
def no_auth_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    """The auth deadline never passes: a close can only be the answer to the frame."""
    from devices.consumers.device import DeviceConsumer

    async def never(seconds: float) -> None:
        await asyncio.Event().wait()

    monkeypatch.setattr(DeviceConsumer, "wait_auth_deadline", staticmethod(never))


@pytest.mark.parametrize("path", ["/ws/device/", "/ws/voice/"])
@pytest.mark.parametrize(
    ("raw", "code"),
    [
        pytest.param("{not json", "malformed_json", id="not-json"),
        pytest.param('{"type": "auth", "x": NaN}', "malformed_json", id="nan"),
        pytest.param("[1]", "invalid_frame", id="not-an-object"),
        pytest.param(r'{"type": "auth", "device_id": "a\u0000"}', "invalid_frame", id="nul"),
        pytest.param('{"type": "auth", "x": ' + FAR_TOO_DEEP + "}", "invalid_frame", id="too-deep"),
    ],
)
async def test_a_first_frame_that_is_not_an_auth_frame_closes_with_4401_at_once(
    owner: Any, no_auth_deadline: None, path: str, raw: str, code: str
) -> None:
    """docs/protocol.md: 4401 for a first frame that is not ``auth`` — at once, not 4408
    when the deadline passes (here it never does)."""
    comm, _ = await open_socket(authenticate=False, path=path)
    await comm.send_to(text_data=raw)
    assert (await comm.receive_json_from())["code"] == code
    assert await comm.receive_output() == {"type": "websocket.close", "code": 4401}


async def test_a_binary_first_frame_closes_with_4401_at_once(owner: Any, no_auth_deadline: None) -> None:
    comm, _ = await open_socket(authenticate=False)
    await comm.send_to(bytes_data=b"\x00\x01")
    assert (await comm.receive_json_from())["code"] == "binary_not_supported"
    assert await comm.receive_output() == {"type": "websocket.close", "code": 4401}


@pytest.mark.parametrize("field", ["gesture", "card_kind"])
@pytest.mark.parametrize("value", [["confirm"], {"confirm": 1}, 1])
async def test_a_gesture_whose_fields_are_not_strings_is_invalid_frame_with_its_id(
    make_device: Any, field: str, value: Any
) -> None:
    sim = await db_async(make_device)("glasses")
    comm, _ = await open_socket(sim)
    frame = {"type": "gesture", "id": "g-1", "gesture": "confirm", "card_kind": "consent", "card_id": str(uuid.uuid4()), field: value}
    await comm.send_json_to(frame)
    error = await comm.receive_json_from()
    assert (error["type"], error["code"], error.get("id")) == ("error", "invalid_frame", "g-1"), error
    await comm.send_json_to({"type": "ping", "id": "after"})
    assert await comm.receive_json_from() == {"type": "pong", "id": "after"}
    await comm.disconnect()


async def test_an_internal_error_carries_the_frames_id(make_device: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from devices import hud

    def broken(*args: Any) -> None:
        raise TypeError("a bug under a handler")

    monkeypatch.setattr(hud, "answer_gesture", broken)
    sim = await db_async(make_device)("glasses")
    comm, _ = await open_socket(sim)
    await comm.send_json_to({"type": "gesture", "id": "g-2", "gesture": "confirm", "card_kind": "consent", "card_id": "c"})
    assert await comm.receive_json_from() == {
        "type": "error", "code": "internal_error", "message": "the server failed on this frame; it logged the error", "id": "g-2",
    }
    await comm.send_json_to({"type": "ping"})  # the next frame's error would not carry the last id
    assert await comm.receive_json_from() == {"type": "pong", "id": None}
    assert await db_async(TimelineEntry.objects.count)() == 0
    await comm.disconnect()
