"""The demo brain's demo script (``fake_brain --script demo``): remembering, a first send
and buying a milk tea walk the real paths — delegation, the gateway, receipts, activity
cards, consent and payment cards answered as ``device_sim approve`` signs them, and
checked reports."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from capabilities import truth
from capabilities.mcp_host import runtime
from capabilities.models import ReceiptRecord
from consent.models import ConsentCard
from devices.simulator import card_id, consent_answer_message, payment_answer_message
from llm.fake_server import Script
from memory.models import Assertion, TimelineEntry
from payments.models import PaymentIntent
from tests.conftest import db_async, open_socket, receive_until
from tests.support.gateway_support import REPO_PACKS, copy_repo_pack

pytestmark = pytest.mark.django_db(transaction=True)
NOT_SENT_REPLY = "没发出去：消息只写进了这台机器上的本地发件箱，没有交给任何邮件服务器，Alice 收不到。 Not sent: it is in the local outbox on this host."


@pytest.fixture
def demo(brain: Any, internal_listener: Path, tmp_path: Path, settings: Any) -> Any:
    """The demo brain with its demo script, and every shipped pack, as ``./yimi up`` runs
    them: more than 20 tools, so sub-agents find theirs with ``find_tools`` first."""
    directory = tmp_path / "packs"
    directory.mkdir()
    for name in sorted(p.parent.name for p in REPO_PACKS.glob("*/plugin.json")):
        copy_repo_pack(directory, name)
    settings.YIMI_PACKS_DIR = directory
    settings.DATA_DIR = tmp_path / "data"
    settings.DATA_DIR.mkdir()
    settings.YIMI_MAIL_DIR = tmp_path / "mail"
    brain.script.rules.extend(Script.load("demo").rules)
    runtime.reset_for_tests()
    yield brain
    runtime.reset_for_tests()


async def say(comm: Any, text: str) -> tuple[dict[str, Any], dict[str, Any]]:
    await comm.send_json_to({"type": "text", "id": "m1", "text": text})
    ack = await receive_until(comm, "text.ack")
    first = await receive_until(comm, "reply.done")
    assert first["reply_to_seq"] == ack["seq"]
    return ack, first


async def follow_up(comm: Any, seq: int) -> dict[str, Any]:
    while True:
        frame = await receive_until(comm, "reply.done", timeout=30)
        if frame["reply_to_seq"] == seq:
            return frame


@pytest.mark.parametrize("text, report", [("remember that I like green tea", "Here is what your memory now says:"), ("记住我喜欢绿茶", "这是记忆里写下的：")])
async def test_remembering_commits_a_memory_with_a_receipt_an_activity_card_and_a_checked_report(demo: Any, make_device: Any, text: str, report: str) -> None:
    phone = await db_async(make_device)("phone")
    comm, _ = await open_socket(phone)
    ack, first = await say(comm, text)
    assert first["text"] == "好，我去办，办好了告诉你。"  # the platform's delegation ack
    card = await receive_until(comm, "activity", timeout=30)
    assert card["status"] == "succeeded"
    done = await follow_up(comm, ack["seq"])
    # the scripted sentence passed the checker; the receipt's facts the owner was not told yet follow it
    assert done["text"].startswith(report) and "memory commit" in done["text"]
    record = await db_async(ReceiptRecord.objects.get)(call__tool="memory__commit")
    assert record.status == "succeeded"
    assert await db_async(Assertion.objects.filter(predicate="preference.note").exists)()
    await comm.disconnect()


@pytest.mark.parametrize("text", ["send Alice a note", "给 Alice 发个消息"])
async def test_a_first_send_asks_on_the_phone_and_once_approved_goes_to_the_local_outbox_and_says_it_was_not_sent(
        demo: Any, make_device: Any, text: str) -> None:
    """No mail server is configured: the approved send writes the local outbox, and the
    report says it was not sent; "发好了，Alice 会收到" cannot pass the checker on that receipt."""
    phone = await db_async(make_device)("phone")
    comm, _ = await open_socket(phone)
    ack, _ = await say(comm, text)
    card = await receive_until(comm, "consent.card", timeout=30)
    assert card["tool"] == "messaging__send" and card["target"] == "alice@example.com" and card["owner_requested"] is True
    waiting = await follow_up(comm, ack["seq"])
    assert waiting["text"] in ("给 Alice 的消息要你在手机上点头：那里有一张卡片。", "To send the note to Alice, answer the card on your phone.")
    await comm.send_json_to({"type": "consent.answer", "id": "a1", "card_id": card_id(card), "answer": "approve",
                             "signature": phone.sign(consent_answer_message(card, "approve"))})
    result = await receive_until(comm, "consent.result")
    assert result["state"] == "approved"
    sent = await follow_up(comm, ack["seq"])
    assert sent["text"].startswith(NOT_SENT_REPLY), (sent["text"], [r["messages"][-1]["content"][:300] for r in demo.script.requests][-1])
    for claim in ("会收到", "已送达", "已发送", "发好了", "Sent."):
        assert claim not in sent["text"], sent["text"]
    record = await db_async(lambda: ReceiptRecord.objects.filter(call__tool="messaging__send").order_by("-revision").first())()
    assert record is not None and record.status == "failed" and record.receipt["error"]["code"] == "not_sent"
    assert record.receipt["effects"] == [{"target": "local outbox", "action": "save", "verification": "verified", "category": "send"}]
    # the old scripted reply, checked against this receipt: neither sentence survives
    facts = truth.render_facts(record.receipt, tool_label="messaging send", key="k")
    old = truth.check_reply("发好了，Alice 会收到。 Sent.", receipts=[record.receipt], delivered_fact_ids=set(), facts=facts)
    assert [reason for _, reason in old.removed] == ["status_contradicts_receipts", "status_contradicts_receipts"]
    assert [reason for _, reason in truth.check_reply("Alice 会收到。", receipts=[record.receipt], delivered_fact_ids=set(),
                                                      facts=facts).removed] == ["delivery_not_proven"]
    await comm.disconnect()


async def until_reply(comm: Any, seq: int, text: str) -> dict[str, Any]:
    """The reply to utterance ``seq`` that says ``text`` (other replies to it may come first)."""
    while True:
        frame = await follow_up(comm, seq)
        if frame["text"] == text:
            return frame


async def test_a_denied_send_changes_nothing_and_is_acknowledged_once(demo: Any, make_device: Any) -> None:
    phone = await db_async(make_device)("phone")
    comm, _ = await open_socket(phone)
    ack, _ = await say(comm, "send Alice a note")
    card = await receive_until(comm, "consent.card", timeout=30)
    answer = {"type": "consent.answer", "id": "d1", "card_id": card_id(card), "answer": "deny",
              "signature": phone.sign(consent_answer_message(card, "deny"))}
    await comm.send_json_to(answer)
    assert (await receive_until(comm, "consent.result"))["state"] == "denied"
    said = await until_reply(comm, ack["seq"], "好，不发了。")  # the platform's template, not the model
    await comm.send_json_to(answer)  # a replayed deny changes nothing and says nothing again
    assert (await receive_until(comm, "error"))["code"] == "card_closed"
    assert not await db_async(ReceiptRecord.objects.filter(call__tool="messaging__send", status="succeeded").exists)()
    entries = await db_async(lambda: list(TimelineEntry.objects.select_related("reply_to").filter(text="好，不发了。")))()
    assert [(e.seq, e.kind, e.reply_to.seq) for e in entries] == [(said["seq"], "reply", ack["seq"])]
    assert (await db_async(ConsentCard.objects.get)()).reported_entry_id == entries[0].id
    await comm.disconnect()


async def test_a_declined_payment_is_acknowledged_and_nothing_is_paid(demo: Any, make_device: Any, settings: Any) -> None:
    phone = await db_async(make_device)("phone")
    comm, _ = await open_socket(phone)
    ack, _ = await say(comm, "buy a milk tea")
    card = await receive_until(comm, "payment.card", timeout=30)
    await comm.send_json_to({"type": "payment.answer", "id": "p1", "authorization_id": card_id(card), "answer": "deny",
                             "signature": phone.sign(payment_answer_message(card, "deny"))})
    assert (await receive_until(comm, "payment.result"))["state"] == "denied"
    said = await until_reply(comm, ack["seq"], "好，不付了。")
    intent = await db_async(PaymentIntent.objects.get)()
    assert intent.state == "cancelled" and intent.reported_entry_id is not None
    assert (await db_async(lambda: TimelineEntry.objects.get(id=intent.reported_entry_id).seq)()) == said["seq"]
    store = Path(settings.DATA_DIR) / "packs" / "shop" / "store.json"
    assert not store.exists() or not json.loads(store.read_text()).get("orders")
    await comm.disconnect()


@pytest.mark.parametrize("text", ["buy a milk tea", "买一杯奶茶"])
async def test_buying_a_milk_tea_shows_a_payment_card_that_approve_pays(demo: Any, make_device: Any, settings: Any, text: str) -> None:
    phone = await db_async(make_device)("phone")
    comm, _ = await open_socket(phone)
    ack, _ = await say(comm, text)
    card = await receive_until(comm, "payment.card", timeout=30)
    assert card["amount"] == "18.00"
    waiting = await follow_up(comm, ack["seq"])
    assert waiting["text"].startswith(("奶茶要你在手机上点头付款：那里有一张付款卡片。", "To pay for the milk tea, answer the payment card on your phone."))
    await comm.send_json_to({"type": "payment.answer", "id": "p1", "authorization_id": card_id(card), "answer": "approve",
                             "signature": phone.sign(payment_answer_message(card, "approve"))})
    assert (await receive_until(comm, "payment.result"))["state"] == "authorized"
    paid = await follow_up(comm, ack["seq"])
    assert paid["text"].startswith("付好了：珍珠奶茶。 Paid.") and "18 yuan" in paid["text"]  # the amount from the receipt
    assert (await db_async(PaymentIntent.objects.get)()).state == "paid"
    store = json.loads((Path(settings.DATA_DIR) / "packs" / "shop" / "store.json").read_text())
    assert len(store["orders"]) == 1
    await comm.disconnect()


async def test_anything_else_gets_the_honest_demo_echo(demo: Any, make_device: Any) -> None:
    phone = await db_async(make_device)("phone")
    comm, _ = await open_socket(phone)
    _, reply = await say(comm, "what is the weather")
    assert reply["text"].startswith("[demo brain]")
    await comm.disconnect()
