"""Scheduled tasks: the only code that writes ``Schedule``.

Beat (``schedules.tasks.fire_due_schedules_task``, registered as
``brain.tasks.fire_due_schedules``; every ``DUE_SWEEP_SECONDS``) claims each due
schedule by compare-and-set on its ``next_run_at`` and creates a real run with
``origin=scheduled`` (``brain.services.create_scheduled_run``) that the runner executes like
any other. It passes the same gateway: inside it, anything that would need a consent card
is blocked (``needs_confirmation_in_scheduled_task``), never asked while nobody is there.
"""

from __future__ import annotations

import logging
import uuid
from datetime import datetime, time, timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from brain.services import create_scheduled_run
from schedules.models import Schedule
from yimi_project.errors import YimiError
from yimi_project.logs import log_event

MIN_INTERVAL_SECONDS = 60
MAX_PROMPT = 2000
FIRE_BATCH = 100


def next_occurrence(*, interval_seconds: int | None, daily_at: time | None, after: datetime, previous: datetime | None = None) -> datetime:
    """The first run time strictly after ``after``: ``previous`` plus whole intervals (missed
    ones are skipped, not caught up), or the next local ``daily_at``."""
    if interval_seconds:
        step = timedelta(seconds=interval_seconds)
        if previous is None:
            return after + step
        missed = max(0, int((after - previous) // step))
        due = previous + step * (missed + 1)
        return due if due > after else due + step
    assert daily_at is not None
    local = timezone.localtime(after)
    candidate = local.replace(hour=daily_at.hour, minute=daily_at.minute, second=daily_at.second, microsecond=0)
    if candidate <= local:
        candidate = timezone.make_aware(datetime.combine(local.date() + timedelta(days=1), daily_at), local.tzinfo)
    return candidate


def create_schedule(
    owner: Any, device: Any, prompt: str, *, interval_seconds: int | None = None, daily_at: time | None = None,
    now: datetime | None = None,
) -> Schedule:
    """Store a schedule for ``owner``: exactly one of an interval (≥ 60 s) or a daily time;
    the device must be the owner's."""
    now = now or timezone.now()
    if device.owner_id != owner.pk:
        raise YimiError("forbidden", "a schedule runs on one of the owner's own devices")
    if not isinstance(prompt, str) or not prompt.strip() or len(prompt) > MAX_PROMPT:
        raise YimiError("invalid_request", f"prompt must be 1 to {MAX_PROMPT} characters")
    if (interval_seconds is None) == (daily_at is None):
        raise YimiError("invalid_request", "give exactly one of interval_seconds or daily_at")
    if interval_seconds is not None and interval_seconds < MIN_INTERVAL_SECONDS:
        raise YimiError("invalid_request", f"interval_seconds must be at least {MIN_INTERVAL_SECONDS}")
    first = next_occurrence(interval_seconds=interval_seconds, daily_at=daily_at, after=now)
    schedule = Schedule.objects.create(
        owner=owner, device=device, prompt=prompt.strip(), interval_seconds=interval_seconds, daily_at=daily_at, next_run_at=first
    )
    log_event("schedule_created", schedule_id=str(schedule.id))
    return schedule


def cancel_schedule(owner: Any, schedule_id: Any) -> bool:
    """Stop a schedule (compare-and-set ``active``); a run already started finishes."""
    try:
        sid = uuid.UUID(str(schedule_id))
    except ValueError:
        return False
    return bool(Schedule.objects.filter(id=sid, owner=owner, active=True).update(active=False, cancelled_at=timezone.now()))


def fire_due_schedules(now: datetime | None = None) -> list[Any]:
    """Create one scheduled run per due schedule; returns the new run ids to dispatch.

    Per schedule, in one transaction: 1. claim it with ``UPDATE … SET next_run_at = <next>
    WHERE id = ? AND active AND next_run_at = <as read>`` (a concurrent beat that loses
    the claim skips it, so no time fires twice); 2. create the run (admission, a
    ``scheduled`` notice as its inbound entry, the run); 3. link it as ``last_run``.
    A schedule whose run cannot be created rolls back and is tried again next time.
    """
    now = now or timezone.now()
    runs: list[Any] = []
    due = list(
        Schedule.objects.filter(active=True, next_run_at__lte=now).select_related("device").order_by("next_run_at")[:FIRE_BATCH]
    )
    for schedule in due:
        nxt = next_occurrence(
            interval_seconds=schedule.interval_seconds, daily_at=schedule.daily_at, after=now, previous=schedule.next_run_at
        )
        try:
            with transaction.atomic():
                claimed = Schedule.objects.filter(id=schedule.id, active=True, next_run_at=schedule.next_run_at).update(next_run_at=nxt)
                if not claimed:
                    continue
                run = create_scheduled_run(schedule.device, schedule.prompt)
                Schedule.objects.filter(id=schedule.id).update(last_run=run)
        except Exception as exc:  # noqa: BLE001 - one broken schedule must not block the others
            log_event("schedule_fire_failed", logging.ERROR, schedule_id=str(schedule.id), error=type(exc).__name__)
            continue
        log_event("schedule_fired", schedule_id=str(schedule.id), run_id=str(run.id))
        runs.append(run.id)
    return runs
