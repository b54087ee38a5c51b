"""Consent (F3 part A): first-send confirmation, non-blocking cards signed on the owner's
device, exactly-once execution, and blocking inside scheduled tasks."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from brain import agents
from brain.agent_loop import execute_agent_task
from brain.consent_execution import execute_approved
from brain.models import Run
from brain.services import accept_utterance
from capabilities.mcp_host import runtime
from capabilities.models import ReceiptRecord, ToolCall
from capabilities.services import CallRequest, decide
from consent import services as consent
from consent.models import ConsentCard, ExecutionToken, RememberedConsent
from memory.models import TimelineEntry
from tests.conftest import db_async, new_client_id, open_socket, receive_until, script
from tests.support.gateway_support import manifest, write_pack
from yimi_project.errors import YimiError

pytestmark = pytest.mark.django_db(transaction=True)

OUTBOX_TOOLS = '''
import os, time
from pathlib import Path
from capabilities.packkit import ToolRegistry, effect, receipt

TOOLS = ToolRegistry()
LOG = Path(os.environ["YIMI_WORKSPACE_DIR"]) / "executed.log"


def done(name, args):
    LOG.parent.mkdir(parents=True, exist_ok=True)
    with LOG.open("a") as fh:
        fh.write(name + " " + str(args.get("to", args.get("what", ""))) + "\\n")
    return receipt("succeeded", effects=[effect(str(args.get("to", "x")), name, "verified")], retry="forbidden")


@TOOLS("Send a message.", {"type": "object", "properties": {"to": {"type": "string"}, "text": {"type": "string"}, "slow": {"type": "boolean"}}})
def send(args):
    if args.get("slow"):  # still running when the call's time is up: it goes on once the test releases it
        for _ in range(1200):
            if (LOG.parent / "release").exists():
                break
            time.sleep(0.05)
    return done("send", args)


@TOOLS("List what was sent.", {"type": "object", "properties": {}})
def sent(args):
    return receipt("succeeded", content={"text": LOG.read_text() if LOG.exists() else ""})


@TOOLS("Change an owner setting.", {"type": "object", "properties": {"what": {"type": "string"}}})
def update(args):
    return done("update", args)


@TOOLS("Delete something for good.", {"type": "object", "properties": {"what": {"type": "string"}}})
def erase(args):
    return done("erase", args)


@TOOLS("Log in somewhere.", {"type": "object", "properties": {"what": {"type": "string"}}})
def login(args):
    return done("login", args)


@TOOLS("Hail a ride.", {"type": "object", "properties": {"what": {"type": "string"}}})
def ride(args):
    return done("ride", args)


@TOOLS("Open the front door.", {"type": "object", "properties": {"what": {"type": "string"}}})
def unlock(args):
    return done("unlock", args)
'''


def outbox_manifest() -> dict[str, Any]:
    return manifest(
        "outbox",
        scopes=["owner"],
        filesystem=["workspace"],  # its log of what it executed
        tools={
            "send": {"effect": "send", "target": "to", "task_type": "message", "retry": "forbidden", "check_with": "sent"},
            "sent": {"effect": "observe"},
            "update": {"effect": "owner_data", "target": "what"},
            "erase": {"effect": "delete", "target": "what"},
            "login": {"effect": "account", "target": "what"},
            "ride": {"effect": "physical", "task_type": "ride"},
            "unlock": {"effect": "physical", "task_type": "door_lock"},
        },
    )


@pytest.fixture
def packs(tmp_path: Path, settings: Any) -> Path:
    directory = tmp_path / "packs"
    directory.mkdir()
    write_pack(directory, "outbox", outbox_manifest(), tools_py=OUTBOX_TOOLS)
    from tests.support.gateway_support import copy_repo_pack

    copy_repo_pack(directory, "workspace")
    settings.YIMI_PACKS_DIR = directory
    settings.YIMI_WORKSPACE_DIR = tmp_path / "workspace"
    runtime.reset_for_tests()
    yield directory
    runtime.reset_for_tests()


def executed(settings: Any) -> list[str]:
    log = Path(settings.YIMI_WORKSPACE_DIR) / "executed.log"
    return log.read_text().splitlines() if log.exists() else []


@pytest.fixture
def phone(make_device: Any, packs: Path) -> Any:
    return make_device("phone")


def new_run(sim: Any) -> Run:
    return Run.objects.get(id=accept_utterance(sim.device, new_client_id(), "please").run_id)


def call(run: Run, tool: str, **args: Any) -> Any:
    return decide(CallRequest(str(run.id), tool, args))


def sign_answer(sim: Any, card: ConsentCard, answer: str) -> str:
    return sim.sign(consent.card_message(card, answer))


def approve(sim: Any, card_id: Any, answer: str = "approve") -> ConsentCard:
    card = ConsentCard.objects.get(id=card_id)
    return consent.answer_card(sim.device, card.id, answer, sign_answer(sim, card, answer))


# --- the rule: required = sending || !requested ----------------------------------------------------


def test_owner_requested_send_asks_the_first_time_then_is_remembered(phone: Any) -> None:
    run = new_run(phone)
    first = call(run, "outbox__send", to="xiaolin", text="hi", owner_requested=True)
    assert (first.decision, first.code) == ("ask", "waiting_for_owner")
    approve(phone, first.card_id)
    assert RememberedConsent.objects.filter(recipient="xiaolin", task_type="message").exists()
    again = call(run, "outbox__send", to="xiaolin", text="another note", owner_requested=True)
    assert again.executes and again.code == "remembered_send"


def test_remembered_consent_does_not_cover_another_recipient(phone: Any) -> None:
    run = new_run(phone)
    approve(phone, call(run, "outbox__send", to="xiaolin", text="a", owner_requested=True).card_id)
    assert call(run, "outbox__send", to="xiaowang", text="b", owner_requested=True).decision == "ask"


def test_remembered_consent_does_not_cover_another_task_type(phone: Any, packs: Path) -> None:
    data = outbox_manifest()
    data["extensions"]["ai.yimi.capability"]["tools"]["send"]["task_type"] = "invoice"
    run = new_run(phone)
    approve(phone, call(run, "outbox__send", to="xiaolin", text="a", owner_requested=True).card_id)
    import os
    import time

    (packs / "outbox" / "plugin.json").write_text(json.dumps(data))
    os.utime(packs / "outbox" / "plugin.json", ns=(time.time_ns() + 10**9,) * 2)
    assert call(run, "outbox__send", to="xiaolin", text="a bill", owner_requested=True).decision == "ask"


def test_an_unrequested_send_always_asks_even_when_remembered(phone: Any) -> None:
    run = new_run(phone)
    approve(phone, call(run, "outbox__send", to="xiaolin", text="a", owner_requested=True).card_id)
    unrequested = call(run, "outbox__send", to="xiaolin", text="b")
    assert unrequested.decision == "ask"
    approve(phone, unrequested.card_id)
    assert RememberedConsent.objects.count() == 1  # an unrequested send is never remembered


@pytest.mark.parametrize("tool", ["outbox__update", "outbox__erase", "outbox__login"])
def test_owner_data_account_delete_go_ahead_when_requested_and_ask_otherwise(phone: Any, tool: str) -> None:
    run = new_run(phone)
    assert call(run, tool, what="x", owner_requested=True).executes
    assert call(run, tool, what="y").decision == "ask"
    assert call(run, tool, what="y2").decision == "ask"  # asked each time, never remembered


def test_a_ride_needs_the_owners_ride_permission(phone: Any) -> None:
    run = new_run(phone)
    assert call(run, "outbox__ride", what="home", owner_requested=True).code == "ride_permission_missing"
    consent.grant_ride_permission(phone.device.owner_id, minutes=30, device=phone.device)
    assert call(run, "outbox__ride", what="home", owner_requested=True).executes
    assert call(run, "outbox__ride", what="office").decision == "ask"  # not requested: still asks


def test_door_locks_are_read_only(phone: Any) -> None:
    run = new_run(phone)
    consent.grant_ride_permission(phone.device.owner_id, minutes=30)
    assert call(run, "outbox__unlock", what="front", owner_requested=True).code == "door_locks_read_only"


def test_anything_that_would_need_a_card_is_blocked_in_a_scheduled_task(phone: Any) -> None:
    run = new_run(phone)
    Run.objects.filter(id=run.id).update(origin=Run.Origin.SCHEDULED)
    blocked = call(run, "outbox__send", to="xiaolin", text="nightly", owner_requested=True)
    assert (blocked.decision, blocked.code) == ("block", "needs_confirmation_in_scheduled_task")
    assert call(run, "outbox__update", what="x").code == "needs_confirmation_in_scheduled_task"
    assert ConsentCard.objects.count() == 0
    assert call(run, "outbox__update", what="x", owner_requested=True).executes


def test_asking_returns_a_waiting_receipt_at_once(phone: Any) -> None:
    run = new_run(phone)
    asked = call(run, "outbox__send", to="xiaolin", text="hi")
    record = ReceiptRecord.objects.get(call_id=asked.call_id)
    assert record.status == "waiting" and record.written_by_gateway
    assert "not executed" in record.receipt["summary"] and record.receipt["next"]["waiting_on"] == "owner"
    assert call(run, "outbox__send", to="xiaolin", text="hi").code == "already_waiting"


# --- answering cards ------------------------------------------------------------------------------


def test_a_forged_or_unsigned_answer_changes_nothing(phone: Any, make_device: Any) -> None:
    run = new_run(phone)
    asked = call(run, "outbox__send", to="xiaolin", text="hi")
    card = ConsentCard.objects.get(id=asked.card_id)
    other = make_device("mac")
    for signature in (None, "AAAA", other.sign(consent.card_message(card, "approve")), phone.sign(consent.card_message(card, "deny"))):
        with pytest.raises(YimiError) as err:
            consent.answer_card(phone.device, card.id, "approve", signature)
        assert err.value.code == "bad_signature"
    assert ConsentCard.objects.get(id=card.id).state == "pending"
    assert not ExecutionToken.objects.exists()


def test_a_guest_device_cannot_answer(phone: Any, make_device: Any) -> None:
    guest = make_device("phone", guest=True)
    card = ConsentCard.objects.get(id=call(new_run(phone), "outbox__send", to="x", text="y").card_id)
    with pytest.raises(YimiError) as err:
        consent.answer_card(guest.device, card.id, "approve", guest.sign(consent.card_message(card, "approve")))
    assert err.value.code == "forbidden"
    assert ConsentCard.objects.get(id=card.id).state == "pending"


def test_deny_records_a_cancelled_receipt(phone: Any) -> None:
    asked = call(new_run(phone), "outbox__send", to="xiaolin", text="hi", owner_requested=True)
    approve(phone, asked.card_id, "deny")
    current = ReceiptRecord.objects.filter(call_id=asked.call_id).order_by("-revision").first()
    assert current.status == "cancelled" and current.revision == 2
    assert not RememberedConsent.objects.exists()


def test_an_expired_card_is_cancelled_and_cannot_be_approved(phone: Any, settings: Any) -> None:
    asked = call(new_run(phone), "outbox__send", to="xiaolin", text="hi")
    ConsentCard.objects.filter(id=asked.card_id).update(expires_at=timezone.now() - timedelta(seconds=1))
    with pytest.raises(YimiError) as err:
        approve(phone, asked.card_id)
    assert err.value.code == "card_expired"
    assert ConsentCard.objects.get(id=asked.card_id).state == "expired"
    assert ReceiptRecord.objects.filter(call_id=asked.call_id).order_by("-revision").first().status == "cancelled"
    assert consent.claim_execution(asked.card_id) is None


def test_the_sweeper_expires_cards_nobody_answered(phone: Any) -> None:
    asked = call(new_run(phone), "outbox__send", to="xiaolin", text="hi")
    ConsentCard.objects.filter(id=asked.card_id).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert consent.expire_cards() == 1 and consent.expire_cards() == 0
    assert ConsentCard.objects.get(id=asked.card_id).state == "expired"


def test_a_second_or_replayed_approval_changes_nothing(phone: Any) -> None:
    asked = call(new_run(phone), "outbox__send", to="xiaolin", text="hi")
    card = ConsentCard.objects.get(id=asked.card_id)
    signature = sign_answer(phone, card, "approve")
    consent.answer_card(phone.device, card.id, "approve", signature)
    with pytest.raises(YimiError) as err:
        consent.answer_card(phone.device, card.id, "approve", signature)
    assert err.value.code == "card_closed"
    assert ExecutionToken.objects.filter(card=card).count() == 1


# --- exactly once ---------------------------------------------------------------------------------


async def test_executing_an_approved_card_again_is_skipped(phone: Any, brain: Any, settings: Any) -> None:
    """Executions one after another (``database_sync_to_async`` runs these on one thread
    and one connection); workers racing on their own connections are in test_races.py."""
    run = await db_async(new_run)(phone)
    asked = await db_async(call)(run, "outbox__send", to="xiaolin", text="hi", owner_requested=True)
    await db_async(approve)(phone, asked.card_id)
    outcomes = await asyncio.gather(execute_approved(asked.card_id), execute_approved(asked.card_id), execute_approved(asked.card_id))
    assert sorted(outcomes) == ["skipped", "skipped", "succeeded"]
    assert executed(settings) == ["send xiaolin"]
    current = await db_async(lambda: ReceiptRecord.objects.filter(call_id=asked.call_id).order_by("-revision").first())()
    assert (current.status, current.revision, current.written_by_gateway) == ("succeeded", 2, False)
    # executing again later (a replayed task) does nothing
    assert await execute_approved(asked.card_id) == "skipped"
    assert executed(settings) == ["send xiaolin"]


async def test_a_disconnect_during_execution_is_unknown_and_must_be_checked(phone: Any, brain: Any, settings: Any) -> None:
    settings.PACK_CALL_TIMEOUT_SECONDS = 0.5  # the slow send runs until released, so it always outlasts this
    run = await db_async(new_run)(phone)
    asked = await db_async(call)(run, "outbox__send", to="xiaolin", text="hi", slow=True, owner_requested=True)
    await db_async(approve)(phone, asked.card_id)
    try:
        assert await execute_approved(asked.card_id) == "unknown"
    finally:
        Path(settings.YIMI_WORKSPACE_DIR, "release").touch()
    current = await db_async(lambda: ReceiptRecord.objects.filter(call_id=asked.call_id).order_by("-revision").first())()
    assert current.receipt["next"] == {"retry": "after_check", "check_with": "sent"}
    again = await db_async(call)(run, "outbox__send", to="xiaolin", text="hi", slow=True, owner_requested=True)
    assert again.code == "check_first"


async def test_an_interrupted_execution_is_settled_as_unknown_never_retried(phone: Any, brain: Any, settings: Any) -> None:
    run = await db_async(new_run)(phone)
    asked = await db_async(call)(run, "outbox__send", to="xiaolin", text="hi")
    await db_async(approve)(phone, asked.card_id)
    assert await db_async(consent.claim_execution)(asked.card_id) is not None  # a worker took it, then died
    await db_async(ExecutionToken.objects.filter(card_id=asked.card_id).update)(claimed_at=timezone.now() - timedelta(hours=1))
    assert await db_async(consent.settle_interrupted_executions)() == 1
    current = await db_async(lambda: ReceiptRecord.objects.filter(call_id=asked.call_id).order_by("-revision").first())()
    assert current.status == "unknown" and executed(settings) == []


async def test_approval_on_the_phone_executes_once_and_a_report_follows(phone: Any, brain: Any, settings: Any) -> None:
    script(brain, match="approved has been handled", reply="已经发给 xiaolin 了。")
    comm, _ = await open_socket(phone)
    run = await db_async(new_run)(phone)
    asked = await db_async(call)(run, "outbox__send", to="xiaolin", text="the notes", owner_requested=True)
    card_frame = await receive_until(comm, "consent.card")
    assert card_frame["card_id"] == asked.card_id and card_frame["category"] == "send" and card_frame["target"] == "xiaolin"
    card = await db_async(ConsentCard.objects.get)(id=asked.card_id)
    await comm.send_json_to({"type": "consent.answer", "id": "a1", "card_id": asked.card_id, "answer": "approve", "signature": sign_answer(phone, card, "approve")})
    result = await receive_until(comm, "consent.result")
    assert result["state"] == "approved"
    report = await receive_until(comm, "reply.done", timeout=20)
    assert "xiaolin" in report["text"]
    assert executed(settings) == ["send xiaolin"]
    # the same answer again changes nothing
    await comm.send_json_to({"type": "consent.answer", "id": "a2", "card_id": asked.card_id, "answer": "approve", "signature": sign_answer(phone, card, "approve")})
    assert (await receive_until(comm, "error"))["code"] == "card_closed"  # refused before anything was started
    assert await execute_approved(asked.card_id) == "skipped"  # and were it started again, nothing would run
    assert executed(settings) == ["send xiaolin"]
    assert await db_async(TimelineEntry.objects.filter(kind="reply", seq=report["seq"]).count)() == 1
    await comm.disconnect()


async def test_pending_cards_reach_a_phone_that_connects_later(phone: Any) -> None:
    run = await db_async(new_run)(phone)
    asked = await db_async(call)(run, "outbox__send", to="xiaolin", text="hi")
    comm, _ = await open_socket(phone)
    assert (await receive_until(comm, "consent.card"))["card_id"] == asked.card_id
    await comm.disconnect()


async def test_the_batch_continues_while_a_card_waits(phone: Any, brain: Any, settings: Any) -> None:
    run = await db_async(new_run)(phone)
    task = await db_async(agents.delegate)(run.id, "send the notes and save a copy")
    script(brain, requires_tool="outbox__send", when="user", reply="", tool_calls=[
        {"name": "outbox__send", "arguments": {"to": "xiaolin", "text": "notes"}},
        {"name": "workspace__write_file", "arguments": {"path": "copy.txt", "content": "notes", "owner_requested": True}},
    ])
    script(brain, requires_tool="outbox__send", when="tool", reply="Saved the copy; the send waits for the owner.")
    script(brain, match="Background task finished", reply="副本存好了，发送在等你确认。")
    assert await execute_agent_task(task.id) == "succeeded"
    decisions = await db_async(lambda: dict(ToolCall.objects.values_list("tool", "decision")))()
    assert decisions == {"outbox__send": "ask", "workspace__write_file": "rewrite"}
    assert (Path(settings.YIMI_WORKSPACE_DIR) / "copy.txt").read_text() == "notes"
    assert executed(settings) == []


def test_revoking_a_remembered_consent_asks_again(phone: Any) -> None:
    run = new_run(phone)
    approve(phone, call(run, "outbox__send", to="xiaolin", text="a", owner_requested=True).card_id)
    remembered = RememberedConsent.objects.get()
    assert consent.revoke_remembered(remembered.id) is True
    assert call(run, "outbox__send", to="xiaolin", text="b", owner_requested=True).decision == "ask"


async def test_the_owner_grants_ride_permission_from_a_signed_device_frame(phone: Any) -> None:
    from accounts.signatures import auth_message

    comm, challenge = await open_socket(phone, authenticate=False)
    await comm.send_json_to({"type": "auth", "device_id": str(phone.device.id), "signature": phone.sign(auth_message(challenge["nonce"], str(phone.device.id)))})
    await receive_until(comm, "ready")
    await comm.send_json_to({"type": "ride.permission", "id": "r0", "minutes": 30, "signature": phone.sign(consent.ride_permission_message(phone.device.id, "other-nonce", 30))})
    assert (await receive_until(comm, "error"))["code"] == "bad_signature"
    assert not await db_async(consent.ride_permission_active)(phone.device.owner_id)
    signature = phone.sign(consent.ride_permission_message(phone.device.id, challenge["nonce"], 30))
    await comm.send_json_to({"type": "ride.permission", "id": "r1", "minutes": 30, "signature": signature})
    assert (await receive_until(comm, "ride.permission.ok"))["id"] == "r1"
    assert await db_async(consent.ride_permission_active)(phone.device.owner_id)
    await comm.disconnect()
