"""Races proven with real concurrency ("exactly once, for real").

Every racer is an OS thread with its own database connection (Django keeps one per
thread; on PostgreSQL each comes from the pool), and a ``threading.Barrier`` releases them
together. ``asyncio.gather`` of ``database_sync_to_async`` calls proves nothing here: those
run one after another on one thread and one connection. Async code (an execution) runs in
each racer under its own ``async_to_sync``, which keeps its database work on that racer's
thread. A race that one attempt may not interleave is repeated a few times. Each racer
closes its connection at the end, so the test database can be dropped.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable
from datetime import timedelta
from decimal import Decimal
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.conf import settings as django_settings
from django.db import connection
from django.utils import timezone

from accounts.models import AdmissionRecord, User
from brain.consent_execution import execute_approved
from brain.models import Run
from brain.payment_execution import execute_payment
from brain.services import accept_utterance
from capabilities.client import call_tool
from capabilities.mcp_host import runtime
from capabilities.models import ReceiptRecord, ToolCall
from capabilities.services import CallRequest, Decision, decide
from consent import services as consent
from consent.models import ConsentCard
from memory.assertions import store as assertions
from memory.assertions.store import CommitRequest, Dependency
from memory.models import Assertion, AssertionDependency, MemoryReceipt
from payments import services as payments
from payments.models import PaymentAuthorization, PaymentIntent, UnlockLease
from tests.conftest import need, new_client_id
from tests.consent.test_consent import OUTBOX_TOOLS, outbox_manifest
from tests.support.gateway_support import copy_repo_pack, write_pack
from yimi_project.errors import YimiError

pytestmark = pytest.mark.django_db(transaction=True)

ROUNDS = 5
# Races whose losing interleaving is narrow (two UPDATEs of one row at the same moment; a
# sweeper's read of its due list and its update straddling an approval) get more rounds.
NARROW_ROUNDS = 20


def race(*racers: Callable[[], Any]) -> list[Any]:
    """Run each racer in its own thread, all released at once; return what each returned,
    or the code of the ``YimiError`` it raised. Anything else a racer raises fails the test."""
    barrier = threading.Barrier(len(racers))
    results: list[Any] = [None] * len(racers)
    crashes: list[BaseException] = []

    def run(index: int, racer: Callable[[], Any]) -> None:
        try:
            barrier.wait(timeout=30)
            results[index] = racer()
        except YimiError as exc:
            results[index] = exc.code
        except BaseException as exc:
            crashes.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i, racer), name=f"racer-{i}") for i, racer in enumerate(racers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not any(thread.is_alive() for thread in threads), "a racer never finished"
    if crashes:
        raise crashes[0]
    return results


@pytest.fixture
def packs(tmp_path: Path, settings: Any) -> Any:
    directory = tmp_path / "packs"
    directory.mkdir()
    write_pack(directory, "outbox", outbox_manifest(), tools_py=OUTBOX_TOOLS)
    copy_repo_pack(directory, "shop")
    settings.YIMI_PACKS_DIR = directory
    settings.YIMI_WORKSPACE_DIR = tmp_path / "workspace"  # the outbox's log of what it sent
    settings.DATA_DIR = tmp_path / "data"  # the shop's store.json lives under it
    settings.DATA_DIR.mkdir()
    runtime.reset_for_tests()
    yield directory
    runtime.reset_for_tests()


@pytest.fixture
def phone(make_device: Any, packs: Path) -> Any:
    return make_device("phone")


@pytest.fixture
def no_payment_loop(monkeypatch: Any) -> None:
    """An auto-payment starts after commit on the server's loop; racers have none (and a
    loop remembered by an earlier test is closed), so nothing is scheduled."""
    monkeypatch.setattr("brain.dispatch._main_loop", None)


def new_run(sim: Any) -> Run:
    return Run.objects.get(id=accept_utterance(sim.device, new_client_id(), "please").run_id)


def decide_call(run: Run, tool: str, **args: Any) -> Decision:
    return decide(CallRequest(str(run.id), tool, args))


def sent(settings: Any) -> list[str]:
    log = Path(settings.YIMI_WORKSPACE_DIR) / "executed.log"
    return log.read_text().splitlines() if log.exists() else []


def latest_receipt(call_id: Any) -> ReceiptRecord:
    return ReceiptRecord.objects.filter(call_id=call_id).order_by("-revision").first()


# --- the gateway: duplicates and cards ------------------------------------------------------------


def test_concurrent_first_attempts_of_one_retry_forbidden_send_allow_exactly_one(phone: Any) -> None:
    """The same remembered send (retry=forbidden), decided three times at once before any
    result: one runs, the others are told it is already running."""
    run = new_run(phone)
    first = decide_call(run, "outbox__send", to="xiaolin", text="hello", owner_requested=True)
    card = ConsentCard.objects.get(id=first.card_id)
    consent.answer_card(phone.device, card.id, "approve", phone.sign(consent.card_message(card, "approve")))
    for attempt in range(ROUNDS):
        send = partial(decide_call, run, "outbox__send", to="xiaolin", text=f"round {attempt}", owner_requested=True)
        decisions = race(send, send, send)
        assert sum(d.executes for d in decisions) == 1, [(d.decision, d.code) for d in decisions]
        assert sorted(d.code for d in decisions if not d.executes) == ["already_running", "already_running"]


def test_concurrent_first_attempts_of_a_call_that_needs_a_card_open_exactly_one_card(phone: Any) -> None:
    run = new_run(phone)
    for attempt in range(ROUNDS):
        send = partial(decide_call, run, "outbox__send", to="xiaolin", text=f"round {attempt}")
        decisions = race(send, send, send)
        assert sorted(d.decision for d in decisions) == ["ask", "block", "block"], [(d.decision, d.code) for d in decisions]
        assert {d.code for d in decisions if d.decision == "block"} == {"already_waiting"}
        fingerprint = ToolCall.objects.get(id=decisions[0].call_id).fingerprint
        assert ConsentCard.objects.filter(call__fingerprint=fingerprint).count() == 1


# --- the payment gate and small auto-pay ---------------------------------------------------------


def test_concurrent_spend_calls_never_both_open_an_authorization_on_one_intent(phone: Any, no_payment_loop: None) -> None:
    for _ in range(ROUNDS):
        run = new_run(phone)
        intent = PaymentIntent.objects.create(owner=run.owner, run=run, payee="milk-tea-shop", merchant="奶茶小铺", amount=Decimal("18.00"))
        pay = partial(decide_call, run, "shop__pay")
        decisions = race(pay, pay)
        assert sorted((d.decision, d.code) for d in decisions) == [("ask", "waiting_for_authorization"), ("block", "already_waiting")]
        assert PaymentAuthorization.objects.filter(intent=intent).count() == 1
        assert PaymentIntent.objects.get(id=intent.id).state == "authorizing"


@pytest.fixture
def autopay_on(settings: Any, phone: Any, no_payment_loop: None) -> Any:
    settings.PAYMENTS_VOICE_PAY_ENABLED = True
    settings.PAYMENTS_AUTOPAY_ENABLED = True
    UnlockLease.objects.create(device=phone.device, expires_at=timezone.now() + timedelta(minutes=30))
    return settings


def voice_checkout(phone: Any, *, payee: str, amount: str) -> Run:
    """A run from a spoken request verified by voiceprint, at a checkout that read back
    ``amount`` for ``payee``, a payee paid days ago (so known)."""
    if not PaymentIntent.objects.filter(payee=payee, state="paid").exists():
        earlier = new_run(phone)
        PaymentIntent.objects.create(owner=earlier.owner, run=earlier, payee=payee, amount=Decimal("10"), state="paid")
        PaymentIntent.objects.filter(payee=payee, state="paid").update(created_at=timezone.now() - timedelta(days=3))
    run = new_run(phone)
    AdmissionRecord.objects.filter(id=run.admission_id).update(channel="voice", reason="voiceprint_verified")
    PaymentIntent.objects.create(owner=run.owner, run=run, payee=payee, amount=Decimal(amount), budget=Decimal("100"))
    return run


def test_concurrent_small_autopays_never_exceed_the_daily_cap(autopay_on: Any, phone: Any) -> None:
    """Four auto-payments of 45 to four payees at once: 3 × 45 fit under 150, the fourth
    goes to the phone as a card. The owner then undoes the three, so the next round starts
    from nothing again."""
    # Where it is about noon, so the owner's day cannot end during the test. Etc/GMT-N is N hours ahead of UTC.
    User.objects.filter(id=phone.device.owner_id).update(time_zone=f"Etc/GMT{timezone.now().hour - 12:+d}")
    for attempt in range(ROUNDS):
        runs = [voice_checkout(phone, payee=f"shop-{attempt}-{i}", amount="45") for i in range(4)]
        decisions = race(*[partial(decide_call, run, "shop__pay") for run in runs])
        assert [d.decision for d in decisions] == ["ask"] * 4
        issued = PaymentAuthorization.objects.select_related("intent").filter(intent__run__in=runs)
        assert sorted(a.method for a in issued) == ["auto", "auto", "auto", "phone_card"]
        assert payments.autopaid_today(phone.device.owner_id, timezone.now()) == Decimal("135")
        for auth in issued:
            if auth.method == "auto":
                payments.undo(phone.device, auth.id, phone.sign(payments.payment_card_message(auth, "undo")), now=auth.authorized_at)
        assert payments.autopaid_today(phone.device.owner_id, timezone.now()) == Decimal("0")


def test_concurrent_small_autopays_never_pay_one_payee_twice_within_30_minutes(autopay_on: Any, phone: Any) -> None:
    for attempt in range(NARROW_ROUNDS):  # 20 × 5 stays under the daily cap
        runs = [voice_checkout(phone, payee=f"payee-{attempt}", amount="5") for _ in range(3)]
        decisions = race(*[partial(decide_call, run, "shop__pay") for run in runs])
        assert [d.decision for d in decisions] == ["ask", "ask", "ask"]
        methods = sorted(PaymentAuthorization.objects.filter(payee=f"payee-{attempt}").values_list("method", flat=True))
        assert methods == ["auto", "phone_card", "phone_card"]


def test_one_payment_authorized_twice_at_once_can_be_paid_only_once(autopay_on: Any, phone: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The owner's payments lock (``memory.locks.lock_owner_payments``), made to matter every
    time: two authorizations of one payment (the same payee and amount, asked in two runs)
    are issued at once, outside the gateway's lock (as a settlement issues a replacement), the
    second while the first has checked the small auto-pay rules and not yet committed. The
    second waits for the lock and then sees the first: one auto-payment and one card for the
    phone, and only one of the two authorizations can ever be used to pay."""
    from memory.locks import PAYMENTS_LOCK_SPACE

    need(connection.vendor == "postgresql", "the lock is PostgreSQL's advisory lock; on SQLite BEGIN IMMEDIATE serializes the two")
    runs = [voice_checkout(phone, payee="milk-tea-shop", amount="18") for _ in range(2)]
    intents = [PaymentIntent.objects.get(run=run) for run in runs]
    calls = [
        ToolCall.objects.create(owner=run.owner, run=run, tool="shop__pay", category="spend", fingerprint=uuid.uuid4().hex,
                                idempotency_key="k", decision="ask")
        for run in runs
    ]
    check = payments.autopay_check
    second_checked, first_checked = threading.Event(), threading.Event()
    second_result: list[Any] = []

    def second() -> None:
        try:
            second_result.append(payments.open_authorization(intents[1], calls[1]))
        except BaseException as exc:  # noqa: BLE001 - the test reports it
            second_result.append(exc)
        finally:
            connection.close()

    other = threading.Thread(target=second, name="second-authorization")

    def waits_for_the_lock() -> bool:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND classid = %s AND objid = %s"
                " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
                [PAYMENTS_LOCK_SPACE, phone.device.owner_id],
            )
            return bool(cursor.fetchone()[0])

    def check_while_the_other_asks(intent: PaymentIntent, now: Any = None) -> Any:
        if intent.id == intents[1].id:  # the second: checks, then commits only after the first has checked
            verdict = check(intent, now)
            second_checked.set()
            assert first_checked.wait(60)
            return verdict
        other.start()  # the first, inside its transaction: the second asks now
        for _ in range(600):  # until the second has checked too, or waits for the first's lock
            if second_checked.wait(0.1) or waits_for_the_lock():
                break
        else:
            pytest.fail("the second authorization neither checked nor waited for the lock")
        verdict = check(intent, now)
        first_checked.set()
        return verdict

    monkeypatch.setattr(payments, "autopay_check", check_while_the_other_asks)
    first = payments.open_authorization(intents[0], calls[0])
    other.join(60)
    monkeypatch.undo()
    assert not other.is_alive() and len(second_result) == 1 and isinstance(second_result[0], PaymentAuthorization), second_result
    issued = [PaymentAuthorization.objects.get(id=a.id) for a in (first, second_result[0])]
    assert [a.method for a in issued] == ["auto", "phone_card"]
    # The executor tries both once the undo window is over: one pays, the other cannot.
    after_undo = issued[0].authorized_at + timedelta(seconds=django_settings.PAYMENTS_AUTOPAY_UNDO_SECONDS + 1)
    used = [payments.claim_authorization(a.id, now=after_undo) is not None for a in issued]
    assert used == [True, False]


# --- approvals racing the expiry sweeper ----------------------------------------------------------


def phone_card(run: Run, amount: str = "18.00") -> PaymentAuthorization:
    intent = PaymentIntent.objects.create(owner=run.owner, run=run, payee="milk-tea-shop", amount=Decimal(amount))
    call = ToolCall.objects.create(
        owner=run.owner, run=run, tool="shop__pay", category="spend", fingerprint=uuid.uuid4().hex, idempotency_key="k", decision="ask"
    )
    return payments.open_authorization(intent, call)


def test_a_payment_approval_racing_the_expiry_sweeper_is_used_once_or_expired_never_both(phone: Any) -> None:
    for _ in range(NARROW_ROUNDS):
        run = new_run(phone)
        auth = phone_card(run)
        t0 = timezone.now()
        PaymentAuthorization.objects.filter(id=auth.id).update(card_expires_at=t0 + timedelta(seconds=30))
        auth = PaymentAuthorization.objects.select_related("intent").get(id=auth.id)
        signature = phone.sign(payments.payment_card_message(auth, "approve"))
        answered, swept = race(
            lambda auth=auth, signature=signature: payments.answer_card(phone.device, auth.id, "approve", signature).state,
            partial(payments.expire_authorizations, now=t0 + timedelta(seconds=31)),
        )
        # Then the executor uses it, twice (a redelivered task).
        used = [payments.claim_authorization(auth.id) is not None for _ in range(2)]
        auth.refresh_from_db()
        intent = PaymentIntent.objects.get(id=auth.intent_id)
        if answered == "authorized":
            assert (auth.state, intent.state, swept, used) == ("used", "paying", 0, [True, False])
        else:
            assert (answered, auth.state, intent.state, swept, used) == ("card_closed", "expired", "cancelled", 1, [False, False])


def test_a_consent_approval_racing_the_expiry_sweeper_is_executed_once_or_expired_never_both(phone: Any, brain: Any, settings: Any) -> None:
    run = new_run(phone)
    for attempt in range(NARROW_ROUNDS):
        asked = decide_call(run, "outbox__send", to=f"friend-{attempt}", text="hi")
        t0 = timezone.now()
        ConsentCard.objects.filter(id=asked.card_id).update(expires_at=t0 + timedelta(seconds=30))
        card = ConsentCard.objects.get(id=asked.card_id)
        signature = phone.sign(consent.card_message(card, "approve"))
        # The owner approves just before the card's end, while the sweeper, whose clock
        # already says it has ended, closes it.
        answered, swept = race(
            lambda card=card, signature=signature: consent.answer_card(phone.device, card.id, "approve", signature).state,
            partial(consent.expire_cards, now=t0 + timedelta(seconds=31)),
        )
        # Then the executor runs it, twice (a redelivered task).
        outcomes = [async_to_sync(execute_approved)(card.id) for _ in range(2)]
        card.refresh_from_db()
        times_sent = sent(settings).count(f"send friend-{attempt}")
        if answered == "approved":
            assert (card.state, swept, outcomes, times_sent) == ("approved", 0, ["succeeded", "skipped"], 1)
            assert latest_receipt(asked.call_id).status == "succeeded"
        else:
            assert (answered, card.state, swept, outcomes, times_sent) == ("card_closed", "expired", 1, ["skipped", "skipped"], 0)
            assert latest_receipt(asked.call_id).status == "cancelled"


# --- exactly-once execution ---------------------------------------------------------------------


def test_three_workers_on_their_own_connections_execute_an_approved_card_once(phone: Any, brain: Any, settings: Any) -> None:
    run = new_run(phone)
    for attempt in range(NARROW_ROUNDS):
        asked = decide_call(run, "outbox__send", to=f"friend-{attempt}", text="hi")
        card = ConsentCard.objects.get(id=asked.card_id)
        consent.answer_card(phone.device, card.id, "approve", phone.sign(consent.card_message(card, "approve")))
        execute = partial(async_to_sync(execute_approved), card.id)
        assert sorted(race(execute, execute, execute)) == ["skipped", "skipped", "succeeded"]
        assert sent(settings).count(f"send friend-{attempt}") == 1
        record = latest_receipt(asked.call_id)
        assert (record.status, record.revision, record.written_by_gateway) == ("succeeded", 2, False)


def test_three_workers_on_their_own_connections_pay_with_one_authorization_once(phone: Any, brain: Any, settings: Any) -> None:
    store = Path(settings.DATA_DIR) / "packs" / "shop" / "store.json"
    for attempt in range(NARROW_ROUNDS):
        run = new_run(phone)

        async def to_checkout(run: Run = run) -> Any:
            await call_tool(str(run.id), "", "shop__add_to_cart", {"item": "珍珠奶茶", "quantity": 1})
            return (await call_tool(str(run.id), "", "shop__checkout", {"owner_requested": True})).receipt

        assert async_to_sync(to_checkout)()["status"] == "succeeded"
        intent = PaymentIntent.objects.get(run=run)
        # The pay call as the gateway records it when it asks (see the gateway's own tests).
        call = ToolCall.objects.create(
            owner=run.owner, run=run, tool="shop__pay", category="spend", fingerprint=uuid.uuid4().hex, idempotency_key="k", decision="ask"
        )
        auth = payments.open_authorization(intent, call)
        auth = PaymentAuthorization.objects.select_related("intent").get(id=auth.id)
        payments.answer_card(phone.device, auth.id, "approve", phone.sign(payments.payment_card_message(auth, "approve")))
        pay = partial(async_to_sync(execute_payment), auth.id)
        assert sorted(race(pay, pay, pay)) == ["paid", "skipped", "skipped"]
        assert len(json.loads(store.read_text())["orders"]) == attempt + 1
        assert PaymentIntent.objects.get(id=intent.id).state == "paid"


# --- memory ------------------------------------------------------------------------------------------


def commit(owner: Any, text: str, *, deps: tuple[tuple[str, int], ...] = ()) -> assertions.CommitResult:
    return assertions.commit(
        CommitRequest(
            owner_id=owner.pk, request_id=uuid.uuid4().hex, predicate="preference.food", payload={"text": text},
            expected_version=0, depends_on=tuple(Dependency(uuid.UUID(a), v) for a, v in deps), actor="agent",
        )
    )


def test_forgetting_a_while_b_is_committed_on_a_leaves_no_live_dependent_of_a_forgotten_assertion(owner: Any) -> None:
    for attempt in range(ROUNDS):
        a = commit(owner, f"a {attempt}").assertion_id
        forgot, concluded = race(
            partial(assertions.forget, owner.pk, a, request_id=f"forget-{attempt}"),
            partial(commit, owner, f"b {attempt}", deps=((a, 1),)),
        )
        assert Assertion.objects.get(id=a).state == "forgotten"
        if concluded == "forgotten":  # the forget went first: B was refused
            assert [f["id"] for f in forgot.forgotten] == [a]
        else:  # B went first: the forget took it along
            assert sorted(f["id"] for f in forgot.forgotten) == sorted([a, concluded.assertion_id])
        live_on_forgotten = AssertionDependency.objects.filter(downstream__state="active", upstream__state="forgotten")
        assert not live_on_forgotten.exists()


def test_concurrent_retries_of_one_forget_write_one_result(owner: Any) -> None:
    for attempt in range(ROUNDS):
        a = commit(owner, f"a {attempt}").assertion_id
        commit(owner, f"b {attempt}", deps=((a, 1),))
        retry = partial(assertions.forget, owner.pk, a, request_id=f"net-retry-{attempt}")
        results = race(retry, retry, retry)
        assert sorted(r.replayed for r in results) == [False, True, True]
        assert len({json.dumps(r.payload() | {"replayed": None}, sort_keys=True) for r in results}) == 1
        assert MemoryReceipt.objects.filter(owner=owner, request_id=f"net-retry-{attempt}").count() == 1
        assert results[0].versions_erased == 2
