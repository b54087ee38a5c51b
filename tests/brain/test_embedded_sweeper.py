"""Time in the embedded default (no broker): the heartbeat that keeps a running run's claim,
and the sweeper on the server's event loop that recovers runs left behind, expires runs too
old to answer and fires due reminders — each on its interval, set lower here than in
production (settings ``RUN_HEARTBEAT_SECONDS``, ``RUN_RECOVERY_SECONDS``, ``DUE_SWEEP_SECONDS``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from brain.models import Run
from brain.runner import execute_run
from brain.services import claim_run
from brain.sweeper import stop_embedded_sweeper
from memory.models import TimelineEntry
from schedules import reminders
from tests.brain.test_runs import age_run, utter
from tests.conftest import db_async, open_socket, script
from tests.consent.test_consent import packs, phone  # noqa: F401 - fixtures: the outbox pack, a phone

pytestmark = pytest.mark.django_db(transaction=True)

# A deadline for polls: generous, and still below production's 30 s recovery interval, so a
# sweeper that ignored RUN_RECOVERY_SECONDS would miss it.
DEADLINE_SECONDS = 20.0


async def poll(what: str, condition: Any, timeout: float = DEADLINE_SECONDS) -> Any:
    deadline = time.monotonic() + timeout
    while not (result := await condition()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)
    return result


def run_state(run_id: Any) -> Any:
    return db_async(lambda: Run.objects.get(id=run_id))()


async def test_the_heartbeat_keeps_a_long_run_claimed(make_device: Any, brain: Any, settings: Any) -> None:
    """The model takes 2.5 s, a dozen heartbeats; a run without one for 1 s could be taken over."""
    settings.RUN_HEARTBEAT_SECONDS = 0.2
    settings.RUN_HEARTBEAT_STALE_SECONDS = 1
    script(brain, match="take your time", hang_seconds=2.5, reply="Here I am, slowly.")
    sim = await db_async(make_device)()
    accepted = await db_async(utter)(sim, "take your time")
    execution = asyncio.ensure_future(execute_run(accepted.run_id))
    first = await poll("the claim", lambda: db_async(Run.objects.filter(id=accepted.run_id, state="running").first)())
    beats, tried = {first.heartbeat_at}, False
    while not execution.done():
        run = await run_state(accepted.run_id)
        beats.add(run.heartbeat_at)
        if run.state == "running" and timezone.now() - run.started_at > timedelta(seconds=1.5):
            assert await db_async(claim_run)(accepted.run_id) is None, "the claim went stale while the run was working"
            tried = True
        await asyncio.sleep(0.05)
    assert tried, "the run ended before anyone could try to take it over"
    assert await execution == "succeeded"
    run = await run_state(accepted.run_id)
    assert run.attempts == 1
    assert len(beats) >= 3 and max(beats) - run.started_at >= timedelta(seconds=1)


@pytest.fixture
async def embedded_sweeper(settings: Any) -> AsyncIterator[None]:
    """The embedded default's sweeper, with intervals of a fraction of a second; stopped
    when the test ends (it lives on the test's event loop)."""
    settings.YIMI_EMBEDDED_SWEEPER = True
    settings.RUN_RECOVERY_SECONDS = 0.5
    settings.DUE_SWEEP_SECONDS = 0.2
    yield
    await stop_embedded_sweeper()


async def test_the_embedded_sweeper_recovers_and_expires_runs_and_fires_reminders_on_its_interval(
    embedded_sweeper: None, make_device: Any, brain: Any, owner: Any
) -> None:
    sim = await db_async(make_device)()
    # Left by an earlier process: found by the sweeper's first round, at its start.
    sentinel = await db_async(utter)(sim, "from before")
    await db_async(age_run)(sentinel.run_id, 600)
    comm, _ = await open_socket(sim)  # the first connection starts the sweeper
    try:
        await poll("the first round", lambda: db_async(Run.objects.filter(id=sentinel.run_id, state="expired").exists)())
        # Left behind after that round: only a later round finds them.
        stranded = await db_async(utter)(sim, "were you there?")
        await db_async(Run.objects.filter(id=stranded.run_id).update)(created_at=timezone.now() - timedelta(seconds=11))
        too_old = await db_async(utter)(sim, "long ago")
        await db_async(age_run)(too_old.run_id, 600)
        made, _ = await db_async(reminders.create_reminder)(owner, "交房租", timezone.now() + timedelta(hours=1))
        await db_async(reminders.Reminder.objects.filter(id=made.id).update)(due_at=timezone.now() - timedelta(seconds=1))

        await poll("the stranded run's reply", lambda: db_async(Run.objects.filter(id=stranded.run_id, state="succeeded").exists)())
        await poll("the old run's expiry", lambda: db_async(Run.objects.filter(id=too_old.run_id, state="expired").exists)())
        await poll("the reminder", lambda: db_async(reminders.Reminder.objects.filter(id=made.id, state="fired").exists)())
    finally:
        await comm.disconnect()
    reply = await db_async(TimelineEntry.objects.get)(kind="reply", reply_to_id=stranded.entry.id)
    assert "were you there?" in reply.text
    notices = await db_async(lambda: sorted(TimelineEntry.objects.filter(kind="notice").values_list("notice_code", flat=True)))()
    assert notices == ["reminder", "run_expired", "run_expired"]
    assert (await run_state(stranded.run_id)).attempts == 1


async def test_the_embedded_sweeper_settles_an_interrupted_consent_execution(embedded_sweeper: None, phone: Any, settings: Any) -> None:  # noqa: F811
    """A web process that died while executing an approved card leaves its token
    ``executing``: the sweeper records the action ``unknown`` (check first), as beat's
    ``consent.tasks.expire_cards`` does with a broker, and never runs it again."""
    from capabilities.models import ReceiptRecord
    from consent.models import ExecutionToken
    from tests.consent.test_consent import approve, call, new_run

    asked = await db_async(lambda: call(new_run(phone), "outbox__send", to="xiaolin", text="hi"))()
    card = await db_async(approve)(phone, asked.card_id)
    # As a process that claimed the execution and died would leave it, long enough ago.
    long_ago = timezone.now() - timedelta(seconds=settings.PACK_CALL_TIMEOUT_SECONDS + 120)
    await db_async(lambda: ExecutionToken.objects.filter(card=card).update(state=ExecutionToken.State.EXECUTING, claimed_at=long_ago, outcome=""))()
    comm, _ = await open_socket(phone)  # the first connection starts the sweeper
    try:
        settled = await poll("the settled token", lambda: db_async(ExecutionToken.objects.filter(card=card, outcome="unknown").first)())
    finally:
        await comm.disconnect()
    assert settled.state == ExecutionToken.State.DONE
    latest = await db_async(lambda: ReceiptRecord.objects.filter(call_id=asked.call_id).order_by("-revision").first())()
    assert (latest.status, latest.written_by_gateway, latest.receipt["next"]["retry"]) == ("unknown", True, "after_check")
