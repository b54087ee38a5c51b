"""Payments (F3 part B): intents only from the owner's own request, one-shot 60-second
authorizations, checkout read-back with at most 2 card replacements, the shop pack's
CheckoutStop, and the optional voice pay / small auto-pay rules."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from accounts.models import AdmissionRecord, User
from brain.models import Run
from brain.payment_execution import execute_payment
from brain.services import accept_utterance
from capabilities.mcp_host import runtime
from capabilities.models import ReceiptRecord, ToolCall
from capabilities.services import CallRequest, decide, record_receipt
from payments import services as payments
from payments.models import PaymentAuthorization, PaymentIntent, UnlockLease
from tests.conftest import db_async, new_client_id, open_socket, receive_until, script
from tests.support.gateway_support import copy_repo_pack
from yimi_project.errors import YimiError

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def shop(tmp_path: Path, settings: Any) -> Path:
    directory = tmp_path / "packs"
    directory.mkdir()
    copy_repo_pack(directory, "shop")
    settings.YIMI_PACKS_DIR = directory
    settings.DATA_DIR = tmp_path / "data"  # the shop's store.json lives under it
    settings.DATA_DIR.mkdir()
    runtime.reset_for_tests()
    yield directory
    runtime.reset_for_tests()


def store_file(settings: Any) -> Path:
    return Path(settings.DATA_DIR) / "packs" / "shop" / "store.json"


def set_price_drift(settings: Any, drift: list[str]) -> None:
    path = store_file(settings)
    store = json.loads(path.read_text())
    store["price_drift"] = drift
    path.write_text(json.dumps(store, ensure_ascii=False))


@pytest.fixture
def phone(make_device: Any, shop: Path) -> Any:
    return make_device("phone")


def new_run(sim: Any, scope_device: Any = None) -> Run:
    return Run.objects.get(id=accept_utterance((scope_device or sim).device, new_client_id(), "点一杯奶茶").run_id)


async def run_tool(run: Run, tool: str, **args: Any) -> tuple[Any, Any]:
    """decide → MCP → receipt, as a sub-agent does (without a model)."""
    from capabilities.client import call_tool

    outcome = await call_tool(str(run.id), "", tool, args)
    return outcome, outcome.receipt


async def to_checkout(run: Run, *, owner_requested: bool = True, budget: str | None = None) -> Any:
    await run_tool(run, "shop__add_to_cart", item="珍珠奶茶", quantity=1)
    args: dict[str, Any] = {"owner_requested": owner_requested}
    if budget is not None:
        args["payment_budget"] = budget
    outcome, receipt = await run_tool(run, "shop__checkout", **args)
    return receipt


def answer(sim: Any, auth_id: Any, reply: str = "approve") -> PaymentAuthorization:
    auth = PaymentAuthorization.objects.select_related("intent").get(id=auth_id)
    return payments.answer_card(sim.device, auth.id, reply, sim.sign(payments.payment_card_message(auth, reply)))


# --- intents -----------------------------------------------------------------------------------


async def test_checkout_without_an_intent_stops_and_reports(phone: Any) -> None:
    run = await db_async(new_run)(phone)
    receipt = await to_checkout(run, owner_requested=False)
    assert receipt["status"] == "failed" and receipt["error"]["code"] == "checkout_stop"
    assert any(v["name"] == "amount" for v in receipt["values"])
    assert await db_async(PaymentIntent.objects.count)() == 0


def test_pay_without_an_intent_is_blocked(phone: Any) -> None:
    run = new_run(phone)
    decision = decide(CallRequest(str(run.id), "shop__pay", {}))
    assert (decision.decision, decision.code) == ("block", "no_payment_intent")


def test_an_intent_from_a_non_owner_scope_is_refused(phone: Any, make_device: Any, shop: Path) -> None:
    from brain.services import run_binding

    guest = make_device("phone", guest=True)
    run = new_run(guest)
    binding = run_binding(run.id)
    assert payments.open_intent(binding, owner_requested=True) is None
    assert payments.gate(binding).code == "payment_not_owner_scope"


def test_a_scheduled_task_cannot_open_an_intent_or_pay(phone: Any) -> None:
    from brain.services import run_binding

    run = new_run(phone)
    Run.objects.filter(id=run.id).update(origin=Run.Origin.SCHEDULED)
    binding = run_binding(run.id)
    assert payments.open_intent(binding, owner_requested=True) is None
    assert payments.gate(binding).code == "needs_confirmation_in_scheduled_task"


def test_the_model_cannot_forge_an_intent_or_authorization(phone: Any) -> None:
    run = new_run(phone)
    decision = decide(CallRequest(str(run.id), "shop__checkout", {"payment_intent_id": "forged", "owner_requested": False}))
    assert decision.arguments["payment_intent_id"] == "" and "payment_intent_id" in decision.overridden
    pay = decide(CallRequest(str(run.id), "shop__pay", {"payment_authorization_id": "forged", "authorized_amount": "0.01"}))
    assert pay.code == "no_payment_intent"


# --- the whole path --------------------------------------------------------------------------------


async def test_phone_card_authorizes_one_payment_that_is_paid_once(phone: Any, brain: Any, settings: Any) -> None:
    script(brain, match="payment the owner asked for has ended", reply="已经付好了，18 元。")
    comm, _ = await open_socket(phone)
    run = await db_async(new_run)(phone)
    checkout = await to_checkout(run)
    assert checkout["status"] == "succeeded"
    pay, receipt = await run_tool(run, "shop__pay")
    assert pay.decision == "ask" and "not paid" in pay.model_text
    card = await receive_until(comm, "payment.card")
    assert card["amount"] == "18.00" and card["payee"] and card["voice_pay"] is False
    auth = await db_async(PaymentAuthorization.objects.select_related("intent").get)(id=card["authorization_id"])
    signature = phone.sign(payments.payment_card_message(auth, "approve"))
    await comm.send_json_to({"type": "payment.answer", "authorization_id": str(auth.id), "answer": "approve", "signature": signature})
    assert (await receive_until(comm, "payment.result"))["state"] == "authorized"
    report = await receive_until(comm, "reply.done", timeout=20)
    assert "18" in report["text"]
    intent = await db_async(PaymentIntent.objects.get)()
    assert intent.state == "paid"
    store = json.loads(store_file(settings).read_text())
    assert len(store["orders"]) == 1
    # the same authorization cannot be used again
    assert await db_async(payments.claim_authorization)(auth.id) is None
    assert await execute_payment(auth.id) == "skipped"
    assert len(json.loads(store_file(settings).read_text())["orders"]) == 1
    await comm.disconnect()


async def test_a_second_order_can_be_paid_after_the_first_was(phone: Any, brain: Any, settings: Any) -> None:
    """A payment's arguments do not name the payment (the intent and authorization are
    injected), so one paid order must not make every later ``shop__pay`` look like a
    repeat of it: each new request asks for its own authorization."""
    script(brain, match="payment the owner asked for has ended", reply="付好了。")
    first = await db_async(new_run)(phone)
    await to_checkout(first)
    pay, _ = await run_tool(first, "shop__pay")
    auth = await db_async(PaymentAuthorization.objects.get)(call_id=pay.call_id)
    await db_async(answer)(phone, auth.id)
    await execute_payment(auth.id)
    assert (await db_async(PaymentIntent.objects.get)()).state == "paid"
    second = await db_async(new_run)(phone)
    await to_checkout(second)
    again, _ = await run_tool(second, "shop__pay")
    assert again.decision == "ask", again.model_text
    assert await db_async(PaymentAuthorization.objects.filter(call_id=again.call_id).exists)()


async def test_an_authorization_is_refused_after_60_seconds(phone: Any) -> None:
    run = await db_async(new_run)(phone)
    await to_checkout(run)
    await run_tool(run, "shop__pay")
    auth = await db_async(PaymentAuthorization.objects.get)()
    await db_async(answer)(phone, auth.id)
    await db_async(PaymentAuthorization.objects.filter(id=auth.id).update)(expires_at=timezone.now() - timedelta(seconds=1))
    assert await execute_payment(auth.id) == "skipped"
    assert await db_async(payments.expire_authorizations)() == 1
    intent = await db_async(PaymentIntent.objects.get)()
    assert intent.state == "cancelled"


def test_a_forged_or_locked_phone_answer_changes_nothing(phone: Any, make_device: Any) -> None:
    run = new_run(phone)
    intent = PaymentIntent.objects.create(owner=run.owner, run=run, payee="milk-tea-shop", amount=Decimal("18.00"))
    call = ToolCall.objects.create(owner=run.owner, run=run, tool="shop__pay", category="spend", fingerprint="f", idempotency_key="k", decision="ask")
    auth = payments.open_authorization(intent, call)
    auth = PaymentAuthorization.objects.select_related("intent").get(id=auth.id)
    mac = make_device("mac")
    with pytest.raises(YimiError) as err:
        payments.answer_card(phone.device, auth.id, "approve", mac.sign(payments.payment_card_message(auth, "approve")))
    assert err.value.code == "bad_signature"
    with pytest.raises(YimiError) as err:
        payments.answer_card(mac.device, auth.id, "approve", mac.sign(payments.payment_card_message(auth, "approve")))
    assert err.value.code == "forbidden"  # payment cards are answered on the phone
    assert PaymentAuthorization.objects.get(id=auth.id).state == "pending"


async def test_a_changed_checkout_amount_replaces_the_card_twice_then_stops(phone: Any, settings: Any, brain: Any) -> None:
    run = await db_async(new_run)(phone)
    await to_checkout(run)
    await asyncio.to_thread(set_price_drift, settings, ["2.00", "1.00", "3.00"])
    pay, _ = await run_tool(run, "shop__pay")
    amounts = []
    for _ in range(3):
        auth = await db_async(lambda: PaymentAuthorization.objects.filter(state="pending").get())()
        amounts.append(auth.amount)
        await db_async(answer)(phone, auth.id)
        await execute_payment(auth.id)
    assert amounts == [Decimal("18.00"), Decimal("20.00"), Decimal("21.00")]
    intent = await db_async(PaymentIntent.objects.get)()
    assert (intent.state, intent.replacements) == ("stopped", 2)
    assert await db_async(PaymentAuthorization.objects.filter(state="pending").count)() == 0
    assert json.loads(store_file(settings).read_text())["orders"] == []
    current = await db_async(lambda: ReceiptRecord.objects.filter(call_id=pay.call_id).order_by("-revision").first())()
    assert current.status == "cancelled"


async def test_one_replacement_then_paid_at_the_new_amount(phone: Any, settings: Any, brain: Any) -> None:
    run = await db_async(new_run)(phone)
    await to_checkout(run)
    await asyncio.to_thread(set_price_drift, settings, ["2.00"])
    await run_tool(run, "shop__pay")
    first = await db_async(lambda: PaymentAuthorization.objects.get(state="pending"))()
    await db_async(answer)(phone, first.id)
    assert await execute_payment(first.id) == "replaced"
    second = await db_async(lambda: PaymentAuthorization.objects.get(state="pending"))()
    assert second.amount == Decimal("20.00")
    await db_async(answer)(phone, second.id)
    assert await execute_payment(second.id) == "paid"
    orders = json.loads(store_file(settings).read_text())["orders"]
    assert len(orders) == 1 and Decimal(str(orders[0]["amount"])) == Decimal("20.00")


# --- voice pay and small auto-pay ---------------------------------------------------------------------


def make_voice_intent(phone: Any, *, amount: str, payee: str = "milk-tea-shop", reason: str = "voiceprint_verified", budget: str | None = "100", created: datetime | None = None) -> PaymentIntent:
    """An intent whose run came from a voice request on ``phone``."""
    run = new_run(phone)
    AdmissionRecord.objects.filter(id=run.admission_id).update(channel="voice", reason=reason)
    intent = PaymentIntent.objects.create(
        owner=run.owner, run=run, payee=payee, amount=Decimal(amount), budget=Decimal(budget) if budget else None
    )
    if created is not None:
        PaymentIntent.objects.filter(id=intent.id).update(created_at=created)
        intent.refresh_from_db()
    return intent


def paid_before(phone: Any, payee: str = "milk-tea-shop") -> None:
    run = new_run(phone)
    PaymentIntent.objects.create(owner=run.owner, run=run, payee=payee, amount=Decimal("10"), state="paid",)
    PaymentIntent.objects.filter(payee=payee, state="paid").update(created_at=timezone.now() - timedelta(days=3))


@pytest.fixture
def voice_pay_on(settings: Any, phone: Any) -> Any:
    settings.PAYMENTS_VOICE_PAY_ENABLED = True
    settings.PAYMENTS_AUTOPAY_ENABLED = True
    UnlockLease.objects.create(device=phone.device, expires_at=timezone.now() + timedelta(minutes=5))
    paid_before(phone)
    return settings


def test_voice_pay_and_autopay_are_off_by_default(phone: Any) -> None:
    paid_before(phone)
    UnlockLease.objects.create(device=phone.device, expires_at=timezone.now() + timedelta(minutes=5))
    intent = make_voice_intent(phone, amount="18")
    assert "voice pay is off" in payments.voice_pay_check(intent).reasons
    assert "small auto-pay is off" in payments.autopay_check(intent).reasons


def test_autopay_needs_every_condition(voice_pay_on: Any, phone: Any) -> None:
    def refusals(**intent: Any) -> list[str]:
        """Why small auto-pay refuses this intent (empty: it may pay), with ok agreeing."""
        check = payments.autopay_check(make_voice_intent(phone, **intent))
        assert check.ok is (check.reasons == [])
        return check.reasons

    assert refusals(amount="18") == []
    assert refusals(amount="51") == ["over the per-payment limit of 50"]
    assert refusals(amount="18", payee="new-shop") == ["the payee is not known"]
    assert refusals(amount="18", reason="trust_window_call") == ["the voice request was not verified by voiceprint"]
    assert refusals(amount="18", budget=None) == ["not within the request's budget"]
    assert refusals(amount="18", budget="10") == ["not within the request's budget"]
    UnlockLease.objects.all().delete()
    assert refusals(amount="18") == ["no valid unlock lease on the phone or glasses"]


def test_autopay_same_payee_rule_counts_unknown_payments_in_the_last_30_minutes(voice_pay_on: Any, phone: Any) -> None:
    now = timezone.now()  # the check's clock is the test's: the window's edges are exact
    earlier = make_voice_intent(phone, amount="10")
    PaymentIntent.objects.filter(id=earlier.id).update(state="unknown", created_at=now - timedelta(minutes=30))
    check = payments.autopay_check(make_voice_intent(phone, amount="10"), now=now)
    assert check.reasons == ["another payment to this payee in the last 30 minutes"]
    PaymentIntent.objects.filter(id=earlier.id).update(created_at=now - timedelta(minutes=30, microseconds=1))
    assert payments.autopay_check(make_voice_intent(phone, amount="10"), now=now).reasons == []


def test_autopay_daily_limit_follows_midnight_in_the_owners_time_zone(voice_pay_on: Any, phone: Any) -> None:
    owner = phone.device.owner
    User.objects.filter(id=owner.id).update(time_zone="Asia/Shanghai")
    # 23:30 in Shanghai on the 1st is 15:30 UTC; 00:30 on the 2nd is 16:30 UTC.
    before_midnight = datetime(2026, 12, 1, 15, 30, tzinfo=UTC)
    after_midnight = datetime(2026, 12, 1, 16, 30, tzinfo=UTC)
    for i, payee in enumerate(["a", "b", "c"]):
        intent = make_voice_intent(phone, amount="45", payee=payee)
        PaymentIntent.objects.filter(id=intent.id).update(state="paid")
        call = ToolCall.objects.create(owner=owner, run=intent.run, tool="shop__pay", category="spend", fingerprint=f"f{i}", idempotency_key=f"k{i}", decision="ask")
        PaymentAuthorization.objects.create(
            intent=intent, call=call, amount=Decimal("45"), payee=payee, method="auto", state="used",
            card_expires_at=before_midnight, authorized_at=before_midnight - timedelta(minutes=10 * i),
        )
    assert payments.autopaid_today(owner.id, before_midnight) == Decimal("135")
    late = make_voice_intent(phone, amount="18")
    assert "over the daily limit of 150" in payments.autopay_check(late, now=before_midnight).reasons
    assert payments.autopaid_today(owner.id, after_midnight) == Decimal("0")
    assert "over the daily limit of 150" not in payments.autopay_check(late, now=after_midnight).reasons


async def autopay_authorization(phone: Any, settings: Any) -> PaymentAuthorization:
    """A voice request on ``phone`` through checkout to ``shop__pay``, authorized by small
    auto-pay. The window the platform schedules the payment after is held at 10 minutes, so
    that scheduled payment never fires while the test runs: the test crosses the window on
    its own clock (``now=``), whatever the machine's speed."""
    assert settings.PAYMENTS_AUTOPAY_UNDO_SECONDS == 5
    run = await db_async(new_run)(phone)
    await db_async(AdmissionRecord.objects.filter(id=run.admission_id).update)(channel="voice", reason="voiceprint_verified")
    await to_checkout(run, budget="30")
    settings.PAYMENTS_AUTOPAY_UNDO_SECONDS = 600
    await run_tool(run, "shop__pay")
    auth = await db_async(PaymentAuthorization.objects.select_related("intent").get)()
    assert auth.method == "auto" and auth.state == "authorized"
    assert auth.undo_until == auth.authorized_at + timedelta(seconds=600)
    return auth


def undo_signature(phone: Any, auth: PaymentAuthorization) -> str:
    return phone.sign(payments.payment_card_message(auth, "undo"))


async def test_undo_within_five_seconds_prevents_the_payment(voice_pay_on: Any, phone: Any, settings: Any, brain: Any) -> None:
    auth = await autopay_authorization(phone, settings)
    last_moment = auth.undo_until - timedelta(microseconds=1)
    assert await execute_payment(auth.id, now=last_moment) == "skipped"  # not before the undo window ends
    undone = await db_async(payments.undo)(phone.device, auth.id, undo_signature(phone, auth), now=last_moment)
    assert undone.state == "voided"
    assert await execute_payment(auth.id, now=auth.undo_until) == "skipped"  # the window is over: still nothing to pay
    assert json.loads(store_file(settings).read_text())["orders"] == []
    assert (await db_async(PaymentIntent.objects.get)(id=auth.intent_id)).state == "cancelled"


async def test_an_undo_when_the_window_ends_is_too_late_and_the_payment_goes_ahead(voice_pay_on: Any, phone: Any, settings: Any, brain: Any) -> None:
    auth = await autopay_authorization(phone, settings)
    with pytest.raises(YimiError) as err:
        await db_async(payments.undo)(phone.device, auth.id, undo_signature(phone, auth), now=auth.undo_until)
    assert err.value.code == "too_late"
    assert await execute_payment(auth.id, now=auth.undo_until) == "paid"
    assert len(json.loads(store_file(settings).read_text())["orders"]) == 1


async def test_autopay_pays_by_itself_after_the_undo_window(voice_pay_on: Any, phone: Any, settings: Any, brain: Any) -> None:
    settings.PAYMENTS_AUTOPAY_UNDO_SECONDS = 1
    run = await db_async(new_run)(phone)
    await db_async(AdmissionRecord.objects.filter(id=run.admission_id).update)(channel="voice", reason="voiceprint_verified")
    await to_checkout(run, budget="30")
    await run_tool(run, "shop__pay")
    # Nobody acts: the payment the platform scheduled pays on its own once the window is
    # over. Waited for, not timed: the 60 s only bound a failure.
    deadline = time.monotonic() + 60
    while (await db_async(PaymentIntent.objects.get)(run=run)).state != "paid":
        assert time.monotonic() < deadline, "the scheduled payment did not pay"
        await asyncio.sleep(0.1)
    assert len(json.loads(store_file(settings).read_text())["orders"]) == 1
    auth = await db_async(PaymentAuthorization.objects.select_related("intent").get)()
    assert auth.state == "used" and auth.used_at >= auth.undo_until  # paid only after the window
    with pytest.raises(YimiError) as err:
        await db_async(payments.undo)(phone.device, auth.id, undo_signature(phone, auth))
    assert err.value.code == "too_late"


def test_voice_confirm_needs_a_spoken_fu_ba_from_the_requesting_device(voice_pay_on: Any, phone: Any) -> None:
    voice_pay_on.PAYMENTS_AUTOPAY_ENABLED = False  # voice pay only: the card waits for 付吧
    intent = make_voice_intent(phone, amount="18")
    call = ToolCall.objects.create(owner=intent.owner, run=intent.run, tool="shop__pay", category="spend", fingerprint="v", idempotency_key="v", decision="ask")
    auth = payments.open_authorization(intent, call)
    assert auth.method == "phone_card"
    typed = accept_utterance(phone.device, new_client_id(), "付吧")  # typed, not spoken
    with pytest.raises(YimiError) as err:
        payments.voice_confirm(phone.device, auth.id, typed.entry.seq)
    assert err.value.code == "not_confirmed"
    spoken = accept_utterance(phone.device, new_client_id(), "付吧")
    AdmissionRecord.objects.filter(run__inbound=spoken.entry).update(channel="voice", reason="voiceprint_verified")
    assert payments.voice_confirm(phone.device, auth.id, spoken.entry.seq).state == "authorized"


def test_record_receipt_refuses_a_pay_result_without_a_used_authorization(phone: Any) -> None:
    run = new_run(phone)
    call = ToolCall.objects.create(owner=run.owner, run=run, tool="shop__pay", category="spend", fingerprint="x", idempotency_key="x", decision="ask")
    with pytest.raises(YimiError) as err:
        record_receipt(call.id, {"receipt_schema": 1, "status": "succeeded"})
    assert err.value.code == "call_not_executed"


def test_voice_confirm_never_rests_on_a_trust_window(voice_pay_on: Any, phone: Any) -> None:
    voice_pay_on.PAYMENTS_AUTOPAY_ENABLED = False
    intent = make_voice_intent(phone, amount="18")
    call = ToolCall.objects.create(owner=intent.owner, run=intent.run, tool="shop__pay", category="spend", fingerprint="w", idempotency_key="w", decision="ask")
    auth = payments.open_authorization(intent, call)
    spoken = accept_utterance(phone.device, new_client_id(), "付吧")
    AdmissionRecord.objects.filter(run__inbound=spoken.entry).update(channel="voice", reason="trust_window_call")
    with pytest.raises(YimiError) as err:
        payments.voice_confirm(phone.device, auth.id, spoken.entry.seq)
    assert err.value.code == "not_confirmed"


# --- payment cards on reconnect ---------------------------------------------------------------------


def issue_payment_card(run: Run) -> str:
    """A phone card through the gateway, as after a checkout that read back 18.00."""
    PaymentIntent.objects.create(
        owner=run.owner, run=run, payee="milk-tea-shop", merchant="奶茶小铺", amount=Decimal("18.00"),
        items=[{"name": "珍珠奶茶", "quantity": 1}], eta="30 分钟",
    )
    decision = decide(CallRequest(str(run.id), "shop__pay", {}))
    assert (decision.decision, decision.code) == ("ask", "waiting_for_authorization")
    return str(decision.card_id)


async def frames_after_ready(comm: Any) -> list[dict[str, Any]]:
    """Everything the server sent on this connection after ``ready``, up to a ping's pong."""
    await comm.send_json_to({"type": "ping", "id": "p"})
    frames = []
    while (frame := json.loads(await comm.receive_from(timeout=5)))["type"] != "pong":
        frames.append(frame)
    return frames


def payment_cards(frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [f for f in frames if f["type"] == "payment.card"]


async def test_an_open_payment_card_reaches_a_phone_that_connects_later_once_as_first_sent(phone: Any, make_device: Any) -> None:
    mac = await db_async(make_device)("mac")  # payment cards go to phones only
    first, _ = await open_socket(phone)
    run = await db_async(new_run)(phone)
    card_id = await db_async(issue_payment_card)(run)
    original = await receive_until(first, "payment.card")
    assert original["authorization_id"] == card_id
    await first.disconnect()
    # the intent moves on (another checkout read) while the phone is away: the card does not
    await db_async(PaymentIntent.objects.filter(run=run).update)(items=[{"name": "芋泥奶茶", "quantity": 2}], eta="45 分钟")

    later, _ = await open_socket(phone)
    assert payment_cards(await frames_after_ready(later)) == [original]  # once, with the same id and payload
    await later.disconnect()
    other, _ = await open_socket(mac)
    assert payment_cards(await frames_after_ready(other)) == []
    await other.disconnect()

    await db_async(answer)(phone, card_id, "deny")
    answered, _ = await open_socket(phone)
    assert payment_cards(await frames_after_ready(answered)) == []
    await answered.disconnect()


async def test_an_expired_payment_card_is_not_sent_again(phone: Any) -> None:
    run = await db_async(new_run)(phone)
    card_id = await db_async(issue_payment_card)(run)
    await db_async(PaymentAuthorization.objects.filter(id=card_id).update)(card_expires_at=timezone.now() - timedelta(seconds=1))
    assert await db_async(payments.pending_cards)(run.owner_id) == []
    comm, _ = await open_socket(phone)
    assert payment_cards(await frames_after_ready(comm)) == []
    await comm.disconnect()
