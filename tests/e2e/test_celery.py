"""Celery as production runs it: a real worker process (prefork, acks late) on Redis, against
the test database. An approved card executes once through the worker; an auto-payment waits
for its undo window (the task's countdown) and an undo inside it stops it; a worker's
heartbeat keeps a long run claimed; a task whose worker was killed with SIGKILL is delivered
again to a new worker and its effect still happens once; every beat entry names a task.

One worker serves the module (its Redis keys and queue under a prefix of its own); the
redelivery test starts its own two."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
from asgiref.sync import async_to_sync
from django.conf import settings as django_settings
from django.db import connection
from django.utils import timezone

from accounts.models import AdmissionRecord
from brain.dispatch import dispatch_card_execution, dispatch_run
from brain.models import Run
from brain.services import accept_utterance, claim_run
from capabilities.mcp_host import runtime
from capabilities.models import ReceiptRecord
from consent import services as consent
from consent.models import ConsentCard, ExecutionToken
from memory.models import TimelineEntry
from payments import services as payments
from payments.models import PaymentAuthorization, PaymentIntent, UnlockLease
from tests.conftest import need, new_client_id, script, use_brain
from tests.consent.test_consent import approve, call
from tests.payments.test_payments import new_run, paid_before, run_tool, store_file, to_checkout
from tests.support.gateway_support import copy_repo_pack, manifest, write_pack
from tests.support.process_support import TASK_SECONDS, CeleryWorker, celery_worker, publishing_to, redis_prefix

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

# The module worker's settings, lowered from production's so the tests wait seconds, not minutes.
UNDO_SECONDS = 3  # the auto-pay undo window (production: 5)
HEARTBEAT_SECONDS = 0.5  # a run's heartbeat (production: 5)

# A pack whose send writes its effect first and then, for text "hold", blocks until the test
# releases it: a task in flight, after its effect, for a worker to die in.
RELAY_TOOLS = '''
import os, time
from pathlib import Path
from capabilities.packkit import ToolRegistry, effect, receipt

TOOLS = ToolRegistry()
WORKSPACE = Path(os.environ["YIMI_WORKSPACE_DIR"])


@TOOLS("Send a message.", {"type": "object", "properties": {"to": {"type": "string"}, "text": {"type": "string"}}})
def send(args):
    to = str(args.get("to", ""))
    with (WORKSPACE / "sent.log").open("a") as fh:
        fh.write(to + "\\n")
    if args.get("text") == "hold":
        (WORKSPACE / (to + ".holding")).touch()
        deadline = time.monotonic() + 60
        while not (WORKSPACE / (to + ".release")).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    return receipt("succeeded", effects=[effect(to, "send", "verified")], retry="forbidden")


@TOOLS("List what was sent.", {"type": "object", "properties": {}})
def sent(args):
    log = WORKSPACE / "sent.log"
    return receipt("succeeded", content={"text": log.read_text() if log.exists() else ""})
'''


def relay_manifest() -> dict[str, Any]:
    return manifest(
        "relay",
        scopes=["owner"],
        filesystem=["workspace"],
        tools={
            "send": {"effect": "send", "target": "to", "task_type": "message", "retry": "forbidden", "check_with": "sent"},
            "sent": {"effect": "observe"},
        },
    )


def require_services() -> None:
    need(connection.vendor == "postgresql", "a Celery worker runs against PostgreSQL (set DATABASE_URL)")
    need(bool(django_settings.REDIS_URL), "a Celery worker needs Redis (set REDIS_URL)")


@pytest.fixture(scope="module")
def platform_dirs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The packs (relay, shop) and the workspace the worker and this process share."""
    root = tmp_path_factory.mktemp("celery")
    (root / "packs").mkdir()
    (root / "workspace").mkdir()
    write_pack(root / "packs", "relay", relay_manifest(), tools_py=RELAY_TOOLS)
    copy_repo_pack(root / "packs", "shop")
    return root


def platform_settings(root: Path, fake_brain: Any) -> dict[str, str]:
    return {
        "YIMI_PACKS_DIR": str(root / "packs"),
        "YIMI_WORKSPACE_DIR": str(root / "workspace"),
        "YIMI_BRAIN_BASE_URL": fake_brain.base_url,
    }


@pytest.fixture(scope="module")
def worker(django_db_setup: Any, fake_brain: Any, platform_dirs: Path) -> Iterator[CeleryWorker]:
    require_services()
    with redis_prefix("celery") as prefix, celery_worker(
        prefix,
        Path(django_settings.DATA_DIR) / f"{prefix}.log",
        **platform_settings(platform_dirs, fake_brain),
        YIMI_PAYMENTS_AUTOPAY_UNDO_SECONDS=str(UNDO_SECONDS),
        YIMI_RUN_HEARTBEAT_SECONDS=str(HEARTBEAT_SECONDS),
    ) as started:
        yield started


@pytest.fixture
def platform(transactional_db: Any, settings: Any, platform_dirs: Path, fake_brain: Any) -> Iterator[None]:
    """This process sees the same packs, workspace and brain role as the workers (the role is
    stored, so whichever process resolves it first finds the test's demo brain)."""
    use_brain(fake_brain.base_url)
    settings.YIMI_PACKS_DIR = platform_dirs / "packs"
    settings.YIMI_WORKSPACE_DIR = platform_dirs / "workspace"
    runtime.reset_for_tests()
    yield
    runtime.reset_for_tests()


@pytest.fixture
def broker(platform: None, worker: CeleryWorker, settings: Any) -> Iterator[CeleryWorker]:
    """Tasks this test dispatches go to the module's worker; the test ends only once the
    worker has finished them (its rows are flushed after the test)."""
    worker.since = len(worker.text())
    with publishing_to(worker.prefix, settings):
        yield worker
        worker.wait_idle()


def sent_to(root: Path, to: str) -> int:
    log = root / "workspace" / "sent.log"
    return log.read_text().splitlines().count(to) if log.exists() else 0


def wait_for(what: str, condition: Any, timeout: float = TASK_SECONDS) -> Any:
    deadline = time.monotonic() + timeout
    while not (result := condition()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)
    return result


def latest_receipt(call_id: Any) -> ReceiptRecord:
    return ReceiptRecord.objects.filter(call_id=call_id).order_by("-revision").first()


# --- consent -----------------------------------------------------------------------------------------


def test_an_approved_card_executes_once_through_the_worker(broker: CeleryWorker, make_device: Any, brain: Any, platform_dirs: Path) -> None:
    phone = make_device("phone")
    to = f"lin-{uuid.uuid4().hex[:6]}"
    asked = call(new_run(phone), "relay__send", to=to, text="hi")
    assert (asked.decision, asked.code) == ("ask", "waiting_for_owner")
    approve(phone, asked.card_id)
    # The dispatch, and the same task delivered again at once: two pool processes race for it.
    for _ in range(2):
        async_to_sync(dispatch_card_execution)(asked.card_id)
    results = broker.wait_for_results("consent.tasks.execute_approved", 2)
    assert sorted(results) == ["'skipped'", "'succeeded'"], broker.tail()
    assert sent_to(platform_dirs, to) == 1
    current = latest_receipt(asked.call_id)
    assert (current.status, current.revision, current.written_by_gateway) == ("succeeded", 2, False)
    assert ExecutionToken.objects.get(card_id=asked.card_id).outcome == "succeeded"
    # The worker told the owner, once.
    card = wait_for("the card's report", lambda: ConsentCard.objects.filter(id=asked.card_id, reported_entry__isnull=False).first())
    assert TimelineEntry.objects.filter(id=card.reported_entry_id, kind="reply").count() == 1


# --- payments: the undo window is the task's countdown ------------------------------------------------


def autopay(phone: Any, settings: Any) -> PaymentAuthorization:
    """A small auto-payment, authorized by the gateway in this process; its payment task goes
    to the worker with the undo window as countdown."""
    settings.PAYMENTS_VOICE_PAY_ENABLED = True
    settings.PAYMENTS_AUTOPAY_ENABLED = True
    settings.PAYMENTS_AUTOPAY_UNDO_SECONDS = UNDO_SECONDS
    UnlockLease.objects.create(device=phone.device, expires_at=timezone.now() + timedelta(minutes=5))
    paid_before(phone)
    run = new_run(phone)
    AdmissionRecord.objects.filter(id=run.admission_id).update(channel="voice", reason="voiceprint_verified")
    checkout = async_to_sync(to_checkout)(run, budget="30")
    assert checkout["status"] == "succeeded", checkout
    async_to_sync(run_tool)(run, "shop__pay")
    auth = PaymentAuthorization.objects.select_related("intent").get(intent__run=run)
    assert (auth.method, auth.state) == ("auto", "authorized") and auth.undo_until is not None
    return auth


def orders_for(settings: Any, auth: PaymentAuthorization) -> int:
    import json

    path = store_file(settings)
    orders = json.loads(path.read_text())["orders"] if path.exists() else []
    return sum(1 for order in orders if order["payment_authorization_id"] == str(auth.id))


def test_an_autopayment_is_paid_by_the_worker_only_after_its_undo_window(
    broker: CeleryWorker, make_device: Any, brain: Any, settings: Any
) -> None:
    phone = make_device("phone")
    auth = autopay(phone, settings)
    # The task reached the worker at once; it pays when the countdown ends, not before.
    assert broker.wait_until("the payment task", lambda: broker.tasks("payments.tasks.execute_payment"))
    assert broker.wait_for_results("payments.tasks.execute_payment", 1) == ["'paid'"], broker.tail()
    auth.refresh_from_db()
    assert auth.state == "used" and auth.used_at >= auth.undo_until  # claimed after the window, not before
    assert PaymentIntent.objects.get(id=auth.intent_id).state == "paid"
    assert orders_for(settings, auth) == 1
    paid = latest_receipt(auth.call_id)
    assert paid.status == "succeeded" and paid.created_at >= auth.undo_until


def test_an_undo_inside_the_window_stops_the_workers_payment(broker: CeleryWorker, make_device: Any, brain: Any, settings: Any) -> None:
    phone = make_device("phone")
    auth = autopay(phone, settings)
    undone = payments.undo(phone.device, auth.id, phone.sign(payments.payment_card_message(auth, "undo")))
    assert undone.state == "voided"
    # The task still runs when its countdown ends, and finds nothing to pay with.
    assert broker.wait_for_results("payments.tasks.execute_payment", 1) == ["'skipped'"], broker.tail()
    assert orders_for(settings, auth) == 0
    assert PaymentAuthorization.objects.get(id=auth.id).state == "voided"
    assert PaymentIntent.objects.get(id=auth.intent_id).state == "cancelled"


# --- the heartbeat on the worker -----------------------------------------------------------------------


def test_the_workers_heartbeat_keeps_a_long_run_claimed(broker: CeleryWorker, make_device: Any, brain: Any, settings: Any) -> None:
    """The model takes 3 s, six heartbeats; a run without one for 1 s could be taken over."""
    settings.RUN_HEARTBEAT_STALE_SECONDS = 1
    script(brain, match="take your time", hang_seconds=3.0, reply="Here I am, slowly.")
    sim = make_device("phone")
    accepted = accept_utterance(sim.device, new_client_id(), "take your time")
    async_to_sync(dispatch_run)(accepted.run_id)
    first = wait_for("the worker to claim the run", lambda: Run.objects.filter(id=accepted.run_id, state="running").first())
    beats, tried = {first.heartbeat_at}, False
    while (run := Run.objects.get(id=accepted.run_id)).state == "running":
        beats.add(run.heartbeat_at)
        if timezone.now() - run.started_at > timedelta(seconds=2):  # twice the stale limit into the run
            assert claim_run(accepted.run_id) is None, "the run's claim went stale while its worker was working"
            tried = True
        assert timezone.now() - run.started_at < timedelta(seconds=TASK_SECONDS), broker.tail()
        time.sleep(0.1)
    assert tried, "the run ended before another worker could try to take it over"
    assert (run.state, run.attempts) == ("succeeded", 1)
    assert len(beats) >= 3 and max(beats) - run.started_at >= timedelta(seconds=1.5)  # it beat, more than once
    assert TimelineEntry.objects.get(reply_to_id=accepted.entry.id, kind="reply").text == "Here I am, slowly."
    assert broker.wait_for_lane_runs([accepted.run_id]) == {str(accepted.run_id): "succeeded"}  # one run, from the run lane


# --- redelivery after a worker was killed --------------------------------------------------------------

VISIBILITY_SECONDS = 3  # production: 3600


def unacked_since(client: redis.Redis, prefix: str) -> list[float]:
    """When each unacknowledged message under ``prefix`` was delivered (kombu's index)."""
    return [score for _, score in client.zrange(f"{prefix}:unacked_index", 0, -1, withscores=True)]


def test_a_task_whose_worker_was_killed_is_delivered_again_and_its_effect_happens_once(
    platform: None, make_device: Any, brain: Any, settings: Any, fake_brain: Any, platform_dirs: Path
) -> None:
    require_services()
    env = {**platform_settings(platform_dirs, fake_brain), "YIMI_CELERY_VISIBILITY_TIMEOUT_SECONDS": str(VISIBILITY_SECONDS)}
    logs = Path(django_settings.DATA_DIR)
    phone = make_device("phone")
    to = f"wang-{uuid.uuid4().hex[:6]}"
    asked = call(new_run(phone), "relay__send", to=to, text="hold")
    approve(phone, asked.card_id)
    client = redis.Redis.from_url(django_settings.REDIS_URL)
    try:
        with redis_prefix("redelivery") as prefix, publishing_to(prefix, settings):
            with celery_worker(prefix, logs / f"{prefix}-a.log", **env) as first:
                async_to_sync(dispatch_card_execution)(asked.card_id)
                first.wait_until("the send", lambda: (platform_dirs / "workspace" / f"{to}.holding").exists())
                (task_id,) = first.tasks("consent.tasks.execute_approved")
                first.kill()  # SIGKILL mid-task, after the effect: nothing was acknowledged
            assert len(unacked_since(client, prefix)) == 1
            # Unacknowledged for longer than the visibility timeout: a new worker takes it back.
            wait_for("the visibility timeout", lambda: time.time() - max(unacked_since(client, prefix)) > VISIBILITY_SECONDS + 0.5)
            with celery_worker(prefix, logs / f"{prefix}-b.log", **env) as second:
                second.wait_until("the task, delivered again", lambda: second.tasks().get(task_id, {}).get("done"))
                assert second.tasks()[task_id]["result"] == "'skipped'", second.tail()
                wait_for("its acknowledgement", lambda: unacked_since(client, prefix) == [])
    finally:
        (platform_dirs / "workspace" / f"{to}.release").touch()  # a send executed again would wait for this
        client.close()
    assert sent_to(platform_dirs, to) == 1  # the effect happened once, before the kill, and never again
    token = ExecutionToken.objects.get(card_id=asked.card_id)
    assert token.state == "executing"  # interrupted: the sweep records it unknown, and never retries it
    ExecutionToken.objects.filter(id=token.id).update(claimed_at=timezone.now() - timedelta(hours=1))
    assert consent.settle_interrupted_executions() == 1
    assert latest_receipt(asked.call_id).status == "unknown"


# --- beat ----------------------------------------------------------------------------------------------


def test_every_beat_schedule_entry_names_a_registered_task() -> None:
    from yimi_project.celery import app

    app.autodiscover_tasks(force=True)
    schedule = app.conf.beat_schedule
    assert schedule == django_settings.CELERY_BEAT_SCHEDULE and schedule
    unknown = {entry: spec["task"] for entry, spec in schedule.items() if spec["task"] not in app.tasks}
    assert unknown == {}
