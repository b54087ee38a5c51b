"""The glasses' HUD (docs/protocol.md "Glasses: HUD cards and gestures"): short card forms,
a nod or a shake answering a card where the card allows it, never a payment, and no
gestures while riding."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings

from consent import services as consent
from consent.models import ConsentCard
from devices import hud
from payments.models import PaymentAuthorization
from tests.conftest import db_async, open_socket, receive_until
from tests.consent.test_consent import call, new_run, packs  # noqa: F401  (packs: the outbox pack fixture)
from tests.payments.test_payments import issue_payment_card, shop  # noqa: F401  (shop: the shop pack fixture)
from tests.payments.test_payments import new_run as payment_run
from yimi_project.errors import YimiError

pytestmark = pytest.mark.django_db(transaction=True)


def waiting_card(sim: Any, to: str = "xiaolin") -> ConsentCard:
    """A consent card through the gateway: an owner-requested first send to ``to``."""
    decision = call(new_run(sim), "outbox__send", to=to, text="hi", owner_requested=True)
    assert (decision.decision, decision.code) == ("ask", "waiting_for_owner")
    return ConsentCard.objects.get(id=decision.card_id)


def gesture(card: ConsentCard, sim: Any, move: str, *, signer: Any = None) -> dict[str, Any]:
    answer = hud.GESTURES[move]
    return {"type": "gesture", "id": f"g-{move}", "gesture": move, "card_kind": "consent", "card_id": str(card.id),
            "signature": (signer or sim).sign(consent.card_message(card, answer))}


# --- short forms -------------------------------------------------------------------------------


def test_every_card_has_a_short_form_within_the_hud_limit() -> None:
    limit = django_settings.HUD_CARD_MAX_CHARS
    frames = [
        {"type": "consent.card", "category": "send", "tool": "messaging__send", "target": "alice@example.com" * 5},
        {"type": "consent.card", "category": "delete", "tool": "files__erase", "target": "旧照片"},
        {"type": "payment.card", "payee": "milk-tea-shop" * 4, "amount": "18.00", "currency": "CNY"},
        {"type": "activity", "title": "把今天会上那份资料整理一下发给小林" * 3, "status": "unknown"},
    ]
    forms = [hud.short_form(f) for f in frames]
    assert all(0 < len(text) <= limit for text in forms), forms
    assert forms[0].startswith("发送给 alice@example.com") and "…" in forms[0] and forms[0].endswith("点头同意/摇头拒绝")
    assert forms[1] == "删除 旧照片 点头同意/摇头拒绝"
    assert forms[2].startswith("付款18.00CNY") and forms[2].endswith("请在手机上确认")
    assert forms[3].endswith("…：结果未知")


def test_only_glasses_get_the_short_form(make_device: Any) -> None:
    frame = {"type": "activity", "title": "订奶茶", "status": "waiting"}
    assert hud.with_hud(make_device("glasses").device, frame)["hud"] == "订奶茶：等你确认"
    assert "hud" not in hud.with_hud(make_device("phone").device, frame)


async def test_glasses_receive_a_waiting_card_with_its_hud_form(make_device: Any, packs: Path) -> None:  # noqa: F811
    glasses = await db_async(make_device)("glasses")
    phone = await db_async(make_device)("phone")
    card = await db_async(waiting_card)(phone)
    comm, _ = await open_socket(glasses)
    frame = await receive_until(comm, "consent.card")
    assert frame["card_id"] == str(card.id) and frame["hud"] == "发送给 xiaolin 点头同意/摇头拒绝"
    await comm.disconnect()


# --- gestures ----------------------------------------------------------------------------------------


def test_a_nod_approves_a_consent_card(make_device: Any, packs: Path) -> None:  # noqa: F811
    glasses = make_device("glasses")
    card = waiting_card(glasses)
    outcome = hud.answer_gesture(glasses.device, gesture(card, glasses, "confirm"))
    assert (outcome.effect, outcome.state) == ("approved", "approved")
    card.refresh_from_db()
    assert card.state == "approved" and card.answered_by_id == glasses.device.id and card.token is not None


async def test_a_shake_over_the_socket_denies_a_consent_card(make_device: Any, packs: Path) -> None:  # noqa: F811
    glasses = await db_async(make_device)("glasses")
    card = await db_async(waiting_card)(glasses)
    comm, _ = await open_socket(glasses)
    await comm.send_json_to(await db_async(gesture)(card, glasses, "dismiss"))
    result = await receive_until(comm, "gesture.result")
    assert result == {"type": "gesture.result", "id": "g-dismiss", "card_kind": "consent", "card_id": str(card.id),
                      "gesture": "dismiss", "effect": "denied", "state": "denied"}
    assert (await db_async(ConsentCard.objects.get)(id=card.id)).state == "denied"
    said = await receive_until(comm, "reply.done")  # a shake is acknowledged like a deny on the phone
    assert said["text"] == "好，不发了。"
    assert (await db_async(ConsentCard.objects.select_related("reported_entry").get)(id=card.id)).reported_entry.seq == said["seq"]
    await comm.disconnect()


def test_a_gesture_signed_by_another_key_or_from_a_phone_changes_nothing(make_device: Any, packs: Path) -> None:  # noqa: F811
    glasses, phone = make_device("glasses"), make_device("phone")
    card = waiting_card(glasses)
    with pytest.raises(YimiError) as forged:
        hud.answer_gesture(glasses.device, gesture(card, glasses, "confirm", signer=phone))
    with pytest.raises(YimiError) as from_phone:
        hud.answer_gesture(phone.device, gesture(card, phone, "confirm"))
    assert (forged.value.code, from_phone.value.code) == ("bad_signature", "forbidden")
    card.refresh_from_db()
    assert card.state == "pending"


async def test_gestures_are_refused_while_the_glasses_report_riding(make_device: Any, packs: Path) -> None:  # noqa: F811
    glasses = await db_async(make_device)("glasses")
    card = await db_async(waiting_card)(glasses)
    comm, _ = await open_socket(glasses)
    await comm.send_json_to({"type": "device.state", "id": "s1", "riding": True})
    assert (await receive_until(comm, "device.state.ok"))["riding"] is True
    for move in ("confirm", "dismiss"):
        await comm.send_json_to(await db_async(gesture)(card, glasses, move))
        error = await receive_until(comm, "error")
        assert (error["code"], error["id"]) == ("gesture_while_riding", f"g-{move}")
    assert (await db_async(ConsentCard.objects.get)(id=card.id)).state == "pending"
    # Off the bike, the same shake answers.
    await comm.send_json_to({"type": "device.state", "id": "s2", "riding": False})
    await receive_until(comm, "device.state.ok")
    await comm.send_json_to(await db_async(gesture)(card, glasses, "dismiss"))
    assert (await receive_until(comm, "gesture.result"))["state"] == "denied"
    await comm.send_json_to({"type": "device.state", "id": "s3", "riding": "yes"})
    assert (await receive_until(comm, "error"))["code"] == "invalid_frame"
    await comm.disconnect()


async def test_a_nod_never_pays(make_device: Any, shop: Path) -> None:  # noqa: F811
    glasses = await db_async(make_device)("glasses")
    phone = await db_async(make_device)("phone")
    auth_id = await db_async(lambda: issue_payment_card(payment_run(phone)))()
    comm, _ = await open_socket(glasses)
    await comm.send_json_to({"type": "gesture", "id": "nod", "gesture": "confirm", "card_kind": "payment", "card_id": auth_id})
    error = await receive_until(comm, "error")
    assert (error["code"], error["id"]) == ("payment_needs_phone", "nod")
    auth = await db_async(PaymentAuthorization.objects.get)(id=auth_id)
    assert auth.state == "pending" and auth.authorized_at is None
    # A shake hides it on the glasses only: the card stays open on the phone.
    await comm.send_json_to({"type": "gesture", "id": "shake", "gesture": "dismiss", "card_kind": "payment", "card_id": auth_id})
    result = await receive_until(comm, "gesture.result")
    assert (result["effect"], result["state"]) == ("dismissed", "pending")
    assert (await db_async(PaymentAuthorization.objects.get)(id=auth_id)).state == "pending"
    await comm.disconnect()
