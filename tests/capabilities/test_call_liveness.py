"""A pack capability dies with its call, and each platform API answers its own pack only
(issue 35, item 4).

Before, a pack's capability was a signature that lived its full lifetime (the call's
execution time + 30 s, ~120 s) whatever became of the call, and any pack that listed
``platform_api: memory`` in its manifest could read the owner's whole memory. Now the
capability is refused as soon as the ledger records the call's end (its result, a failure,
a timeout, a cancel), and the memory API (like every API holding the owner's data) answers
calls of the pack it was made for, for that call's owner.

The clock is frozen at the minting time (``call_capability.clock``): nothing below is
refused because it expired.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from brain.models import Run
from brain.services import accept_utterance
from capabilities import services
from capabilities.client import call_tool
from capabilities.manifest import PackSet, load_packs
from capabilities.mcp_host import runtime
from capabilities.models import ToolCall
from capabilities.services import CallRequest, decide, record_gateway_receipt, record_receipt
from memory.assertions import store as assertions
from tests.conftest import internal_client, new_client_id
from tests.support.gateway_support import manifest, write_pack
from yimi_project import call_capability
from yimi_project.internal import API_PACKS

T0 = 1_900_000_000.0  # the frozen clock: every capability below is minted and presented at T0

MEMORY_TOOLS = r'''
import json, os, time
import capabilities.packkit as kit
from capabilities.packkit import ToolRegistry, platform_call, receipt

TOOLS = ToolRegistry()


@TOOLS("Read the owner's memory and keep this call's capability where the test finds it.",
       {"type": "object", "properties": {"name": {"type": "string"}, "mode": {"type": "string"}}})
def peek(args):
    status, body = platform_call("GET", "memory/assertions/")
    seen = [a["predicate"] for a in body["assertions"]] if status == 200 else []
    own = os.path.join(os.environ["YIMI_PACKS_DATA_DIR"], "memory")
    path = os.path.join(own, args["name"] + ".json")
    with open(path + ".tmp", "w") as fh:
        json.dump({"capability": kit._current.capability, "status": status, "seen": seen}, fh)
    os.replace(path + ".tmp", path)
    if args.get("mode") == "wait":  # hold the call until the test releases it (it times out or is cancelled first)
        release = os.path.join(own, args["name"] + ".release")
        deadline = time.monotonic() + 120
        while not os.path.exists(release) and time.monotonic() < deadline:
            time.sleep(0.05)
    if args.get("mode") == "fail":
        raise RuntimeError("the pack failed")
    return receipt("succeeded", content={"text": str(status)})


@TOOLS("A long task.", {"type": "object", "properties": {}})
def long(args):
    return receipt("running", task_id="long-1", revision=1)


@TOOLS("Save something of the owner's.", {"type": "object", "properties": {"text": {"type": "string"}}})
def save(args):
    return receipt("unknown")
'''

MEMORY_SPEC = {"peek": {"effect": "observe"}, "long": {"effect": "observe", "long_running": True}, "save": {"effect": "owner_data"}}


def memory_pack(directory: Path) -> None:
    data = manifest("memory", tools=MEMORY_SPEC, scopes=["owner"], platform_api=["memory", "executor"], filesystem=["own"])
    write_pack(directory, "memory", data=data, tools_py=MEMORY_TOOLS)


@pytest.fixture
def frozen_clock(monkeypatch: Any) -> None:
    monkeypatch.setattr(call_capability, "clock", lambda: T0)


@pytest.fixture
def packs_dir(tmp_path: Path, settings: Any) -> Path:
    directory = tmp_path / "packs"
    directory.mkdir()
    memory_pack(directory)
    settings.YIMI_PACKS_DIR = directory
    return directory


def new_run(device: Any) -> Run:
    return Run.objects.get(id=accept_utterance(device, new_client_id(), "看看我记了什么").run_id)


def reads_memory(capability: str) -> int:
    return internal_client(**{call_capability.HEADER: capability}).get("/internal/memory/assertions/").status_code


def remember(owner_id: int, predicate: str) -> None:
    assertions.commit(assertions.CommitRequest.from_payload(
        owner_id, {"predicate": predicate, "payload": {"text": "x"}, "expected_version": 0, "request_id": predicate}, actor="owner",
    ))


# --- in process: when a call has ended --------------------------------------------------------


@pytest.mark.django_db
def test_the_capability_dies_when_the_calls_result_is_recorded(packs_dir: Path, make_device: Any, frozen_clock: None) -> None:
    run = new_run(make_device().device)
    first = decide(CallRequest(str(run.id), "memory__peek", {"name": "a"}))
    other = decide(CallRequest(str(run.id), "memory__peek", {"name": "b"}))
    assert reads_memory(first.pack_capability) == 200  # executing: it works
    record_receipt(first.call_id, {"receipt_schema": 1, "status": "succeeded"})
    assert reads_memory(first.pack_capability) == 403  # ended: refused at once, at the same T0
    assert reads_memory(other.pack_capability) == 200  # another call still executing is not touched
    assert call_capability.verify(call_capability.PACK, first.pack_capability) is not None  # not expired: ended


@pytest.mark.django_db
def test_a_failed_or_lost_result_ends_the_call_too(packs_dir: Path, make_device: Any, frozen_clock: None) -> None:
    run = new_run(make_device().device)
    for error in ("TIMEOUT: no result within 90 s", "CANCELLED: the call was cancelled", "the tool reported an error: boom"):
        decision = decide(CallRequest(str(run.id), "memory__peek", {"name": error[:6]}))
        record_receipt(decision.call_id, None, transport_error=error)
        assert reads_memory(decision.pack_capability) == 403, error


@pytest.mark.django_db
def test_a_call_executed_again_gets_a_capability_of_its_own(packs_dir: Path, make_device: Any, frozen_clock: None) -> None:
    """A call executed again (an approved card; a payment after a new authorization) gets a
    new capability, which the earlier results do not end; its own next result does."""
    run = new_run(make_device().device)
    decision = decide(CallRequest(str(run.id), "memory__peek", {"name": "again"}))
    record_receipt(decision.call_id, {"receipt_schema": 1, "status": "failed", "error": {"code": "AMOUNT_CHANGED"}})
    record_gateway_receipt(decision.call_id, "waiting", "waiting for a new authorization")
    again = services.execution_capability(decision.call_id)
    assert again is not None
    assert reads_memory(decision.pack_capability) == 403
    assert reads_memory(again) == 200
    record_gateway_receipt(decision.call_id, "cancelled", "the owner declined")
    assert reads_memory(again) == 403


@pytest.mark.django_db
def test_an_approved_calls_capability_lives_past_its_waiting_receipt(packs_dir: Path, make_device: Any, frozen_clock: None) -> None:
    """A call the owner was asked about has a ``waiting`` receipt before it runs; the
    capability ``recheck_approved`` issues for running it is not ended by that, only by
    what comes after."""
    run = new_run(make_device().device)
    asked = decide(CallRequest(str(run.id), "memory__save", {"text": "x"}))
    assert asked.decision == "ask" and asked.pack_capability is None
    approved = services.recheck_approved(asked.call_id)
    assert approved.executes and approved.pack_capability is not None
    assert reads_memory(approved.pack_capability) == 200
    record_gateway_receipt(asked.call_id, "cancelled", "not executed")
    assert reads_memory(approved.pack_capability) == 403


@pytest.mark.django_db
def test_a_long_running_tools_capability_keeps_only_the_model_steps_after_its_call(
    packs_dir: Path, make_device: Any, frozen_clock: None,
) -> None:
    """A ``long_running`` call starts a task that outlives it (the phone's errand): after the
    call ended its capability still reaches ``executor`` (no owner data) until it expires,
    and nothing else."""
    run = new_run(make_device().device)
    decision = decide(CallRequest(str(run.id), "memory__long", {}))
    claims = call_capability.verify(call_capability.PACK, decision.pack_capability)
    assert claims is not None and claims["long_running"] is True
    record_receipt(decision.call_id, {"receipt_schema": 1, "status": "running", "task_id": "long-1", "revision": 1})
    assert reads_memory(decision.pack_capability) == 403
    chat = internal_client(**{call_capability.HEADER: decision.pack_capability}).post(
        "/internal/executor/chat/", {"messages": []}, content_type="application/json"
    )
    assert chat.status_code == 400 and chat.json()["error"]["code"] == "invalid_request"  # past the capability check
    assert call_capability.verify(call_capability.PACK, decision.pack_capability, now=claims["exp"]) is None  # until it expires
    plain = decide(CallRequest(str(run.id), "memory__peek", {"name": "plain"}))
    record_receipt(plain.call_id, {"receipt_schema": 1, "status": "succeeded"})
    refused = internal_client(**{call_capability.HEADER: plain.pack_capability}).post(
        "/internal/executor/chat/", {"messages": []}, content_type="application/json"
    )
    assert refused.status_code == 403


# --- each API answers its own pack ------------------------------------------------------------

ENDPOINTS = {
    "memory": ("get", "/internal/memory/assertions/", None),
    "reminders": ("get", "/internal/reminders/", None),
    "model_settings": ("get", "/internal/model-settings/", None),
    "erasure": ("post", "/internal/erasure/result/", {"erasure_id": "00000000-0000-0000-0000-000000000000"}),
    "profile": ("get", "/internal/profile/", None),
    "location": ("post", "/internal/location/where/", {}),
    "health": ("post", "/internal/health/read/", {}),
    "watches": ("post", "/internal/watches/parcels/", {"action": "list"}),
    "mac": ("post", "/internal/mac/op/", {"kind": "list_dir", "payload": {"path": "/"}}),
    "workshop": ("post", "/internal/workshop/", {"action": "builds"}),
    "releases": ("post", "/internal/releases/status/", {}),
}


def test_every_api_holding_owner_data_is_listed() -> None:
    assert set(ENDPOINTS) == set(API_PACKS)


@pytest.mark.django_db
@pytest.mark.parametrize("api", sorted(ENDPOINTS))
def test_declaring_an_api_is_not_enough(owner: Any, api: str) -> None:
    """A live, validly signed capability of a pack that declared the API, but is not the
    pack the API serves, gets ``forbidden``; the API's own pack gets past the check."""
    from tests.conftest import pack_capability

    method, path, body = ENDPOINTS[api]

    def ask(pack: str) -> Any:
        cap = pack_capability(owner.pk, pack=pack, category="observe", apis=[api], tool=f"{pack}__list_dir")
        client = internal_client(**{call_capability.HEADER: cap})
        return getattr(client, method)(path, body, content_type="application/json") if body is not None else client.get(path)

    refused = ask("intruder")
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "forbidden"
    if api != "mac":  # the Mac relay would wait for a Mac; tests/devices/test_owner_mac.py covers its own pack
        assert ask(sorted(API_PACKS[api])[0]).status_code != 403


@pytest.mark.django_db
def test_a_published_version_under_a_shipped_packs_name_gets_nothing(packs_dir: Path, make_device: Any, frozen_clock: None) -> None:
    """The memory API is the shipped memory pack's: a registry version called ``memory``
    (its capability says ``published``) is refused like any other pack."""
    decision = decide(CallRequest(str(new_run(make_device().device).id), "memory__peek", {"name": "shipped"}))
    assert reads_memory(decision.pack_capability) == 200
    packs = load_packs()
    published = PackSet(packs={"memory": replace(packs.packs["memory"], digest="d" * 64)})
    tool = packs.tool("memory__peek")
    assert tool is not None
    capability = services.pack_capability(ToolCall.objects.get(id=decision.call_id), tool, packs=published)
    claims = call_capability.verify(call_capability.PACK, capability)
    assert claims is not None and claims["published"] is True
    assert reads_memory(capability) == 403


def ask_api(api: str, capability: str) -> Any:
    method, path, body = {**ENDPOINTS, "executor": ("post", "/internal/executor/chat/", {"messages": []})}[api]
    client = internal_client(**{call_capability.HEADER: capability})
    return getattr(client, method)(path, body, content_type="application/json") if body is not None else client.get(path)


@pytest.mark.django_db(transaction=True)  # the Mac endpoint asks on a database thread of its own
@pytest.mark.parametrize("api", sorted([*ENDPOINTS, "executor"]))
def test_every_api_refuses_an_ended_calls_capability(packs_dir: Path, make_device: Any, frozen_clock: None, api: str) -> None:
    device = make_device().device
    run = new_run(device)
    ended = decide(CallRequest(str(run.id), "memory__peek", {"name": "ended"}))
    record_receipt(ended.call_id, {"receipt_schema": 1, "status": "succeeded"})
    executing = decide(CallRequest(str(run.id), "memory__peek", {"name": "executing"}))
    pack = {"mac": "owner-mac", "executor": "phone"}.get(api) or sorted(API_PACKS[api])[0]

    def capability(call_id: str | None) -> str:
        claims = {"call": call_id, "run": str(run.id), "owner": device.owner_id, "pack": pack, "tool": f"{pack}__list_dir",
                  "category": "observe", "target": {}, "apis": [api]}
        return call_capability.mint(call_capability.PACK, claims, ttl_seconds=120)

    refused = ask_api(api, capability(ended.call_id))
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "forbidden"
    if api != "mac":  # the Mac relay would wait for a Mac
        assert ask_api(api, capability(executing.call_id)).status_code != 403


@pytest.mark.django_db
def test_memory_reads_are_the_calls_owners_only(packs_dir: Path, make_device: Any, django_user_model: Any, frozen_clock: None) -> None:
    device = make_device().device
    neighbour = django_user_model.objects.create_user("neighbour", password="x" * 12)
    remember(device.owner_id, "preference.mine")
    remember(neighbour.pk, "preference.theirs")
    decision = decide(CallRequest(str(new_run(device).id), "memory__peek", {"name": "own"}))
    body = internal_client(**{call_capability.HEADER: decision.pack_capability}).get("/internal/memory/assertions/").json()
    assert [a["predicate"] for a in body["assertions"]] == ["preference.mine"]


# --- a real pack: its capability after its call ended ------------------------------------------


@pytest.fixture
def live_pack(packs_dir: Path, settings: Any, internal_listener: Path, frozen_clock: None) -> Any:
    own = Path(settings.DATA_DIR) / "packs" / "memory"
    shutil.rmtree(own, ignore_errors=True)  # the data directory outlives a test: no other test's files
    own.mkdir(parents=True)
    runtime.reset_for_tests()
    yield own
    for kept_file in own.glob("*.json"):
        kept_file.with_suffix(".release").touch()  # let a held handler end
    runtime.reset_for_tests()


def kept(own: Path, name: str) -> dict[str, Any]:
    return json.loads((own / f"{name}.json").read_text())


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("mode", ["ok", "fail"])
def test_a_real_packs_capability_dies_with_its_call(live_pack: Path, make_device: Any, mode: str) -> None:
    device = make_device().device
    remember(device.owner_id, "preference.tea")
    run = new_run(device)
    outcome = asyncio.run(call_tool(str(run.id), "", "memory__peek", {"name": mode, "mode": mode}))
    assert outcome.executed, outcome.model_text
    assert outcome.receipt["status"] == ("succeeded" if mode == "ok" else "unknown")
    during = kept(live_pack, mode)
    assert (during["status"], during["seen"]) == (200, ["preference.tea"])  # during the call: the owner's memory
    assert reads_memory(during["capability"]) == 403  # after it: nothing, though it has not expired


@pytest.mark.django_db(transaction=True)
def test_a_timed_out_calls_capability_is_refused_at_once(live_pack: Path, make_device: Any, settings: Any) -> None:
    """The pack's handler is still running after the call timed out; its capability is
    refused from the moment the timeout is recorded, not when it expires."""
    settings.PACK_CALL_TIMEOUT_SECONDS = 1  # the handler waits for a release that comes after the timeout
    run = new_run(make_device().device)
    outcome = asyncio.run(call_tool(str(run.id), "", "memory__peek", {"name": "wait", "mode": "wait"}))
    assert outcome.receipt["status"] == "unknown" and "TIMEOUT" in outcome.receipt["unknowns"][0]
    during = kept(live_pack, "wait")
    assert during["status"] == 200
    assert reads_memory(during["capability"]) == 403


@pytest.mark.django_db(transaction=True)
def test_a_cancelled_calls_capability_is_refused_at_once(live_pack: Path, make_device: Any) -> None:
    run = new_run(make_device().device)

    async def cancel_while_executing() -> None:
        task = asyncio.ensure_future(call_tool(str(run.id), "", "memory__peek", {"name": "cancel", "mode": "wait"}))
        deadline = time.monotonic() + 120  # a bound on a failure, not a timing assertion
        while not (live_pack / "cancel.json").exists():
            assert time.monotonic() < deadline and not task.done(), "the pack never started executing the call"
            await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancel_while_executing())
    during = kept(live_pack, "cancel")
    assert during["status"] == 200
    (record,) = services.ReceiptRecord.objects.filter(call__tool="memory__peek")
    assert record.status == "unknown" and "CANCELLED" in record.receipt["unknowns"][0]
    assert reads_memory(during["capability"]) == 403
