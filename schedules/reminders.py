"""Reminders the owner asked for, fired into the timeline at their time (the ``schedule``
pack's platform side): the only code that writes ``Reminder`` (``schedules.models``)."""

from __future__ import annotations

import logging
import uuid
from datetime import UTC, datetime
from functools import partial
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from memory.timeline.entries import append_entry
from schedules.models import Reminder
from yimi_project import push
from yimi_project.errors import YimiError
from yimi_project.logs import log_event

MAX_TEXT = 500
MAX_KEY = 64
FIRE_BATCH = 100
NOTICE_PREFIX = "⏰ 提醒："


def _parse_due(due_at: Any) -> datetime:
    if isinstance(due_at, str):
        try:
            due_at = datetime.fromisoformat(due_at.strip())
        except ValueError:
            raise YimiError("invalid_request", "due_at must be an ISO 8601 date and time with a timezone") from None
    if not isinstance(due_at, datetime):
        raise YimiError("invalid_request", "due_at must be an ISO 8601 date and time with a timezone")
    if timezone.is_naive(due_at):
        raise YimiError("invalid_request", "due_at needs a timezone (for example 2026-12-01T09:00:00+08:00)")
    return due_at


def _check_key(idempotency_key: Any) -> str | None:
    if idempotency_key is None:
        return None
    if not isinstance(idempotency_key, str) or not 1 <= len(idempotency_key) <= MAX_KEY:
        raise YimiError("invalid_request", f"idempotency_key must be a string of 1 to {MAX_KEY} characters")
    return idempotency_key


def create_reminder(owner: Any, text: Any, due_at: Any, idempotency_key: Any = None) -> tuple[Reminder, bool]:
    """Schedule a reminder; returns ``(reminder, created)``.

    Steps: 1. with an idempotency key already used by this owner, return that reminder
    (``created`` False) before any other check, so a retry after the time has passed still
    finds it; 2. validate the text (1-500 characters) and ``due_at`` (timezone-aware, in the
    future); 3. insert. Two concurrent creates with the same key meet the unique constraint
    (owner, key): the loser returns the winner's row.
    """
    key = _check_key(idempotency_key)
    if key is not None:
        existing = Reminder.objects.filter(owner=owner, idempotency_key=key).first()
        if existing is not None:
            return existing, False
    if not isinstance(text, str) or not text.strip() or len(text.strip()) > MAX_TEXT:
        raise YimiError("invalid_request", f"text must be 1 to {MAX_TEXT} characters")
    due = _parse_due(due_at)
    if due <= timezone.now():
        raise YimiError("invalid_request", "due_at must be in the future")
    try:
        with transaction.atomic():
            reminder = Reminder.objects.create(owner=owner, text=text.strip(), due_at=due, idempotency_key=key)
    except IntegrityError:
        existing = Reminder.objects.filter(owner=owner, idempotency_key=key).first() if key else None
        if existing is None:
            raise
        return existing, False
    log_event("reminder_created", reminder_id=str(reminder.id))
    return reminder, True


def list_reminders(owner: Any, include_done: bool = False) -> list[Reminder]:
    """The owner's reminders by due time: scheduled ones, or all with ``include_done``."""
    qs = Reminder.objects.filter(owner=owner)
    if not include_done:
        qs = qs.filter(state=Reminder.State.SCHEDULED)
    return list(qs.order_by("due_at", "created_at"))


def cancel_reminder(owner: Any, reminder_id: Any) -> Reminder:
    """Cancel a scheduled reminder and return it.

    Steps: 1. compare-and-set ``UPDATE ... WHERE state='scheduled'`` → cancelled; 2. if no
    row changed, read it: unknown (or another owner's) → ``not_found``; already fired →
    ``reminder_already_fired``; already cancelled → returned as is (a retried cancel is
    not an error). A reminder being fired at the same moment is either fired or cancelled,
    never both.
    """
    try:
        rid = uuid.UUID(str(reminder_id))
    except ValueError:
        raise YimiError("not_found", "there is no such reminder") from None
    changed = Reminder.objects.filter(id=rid, owner=owner, state=Reminder.State.SCHEDULED).update(
        state=Reminder.State.CANCELLED, cancelled_at=timezone.now()
    )
    reminder = Reminder.objects.filter(id=rid, owner=owner).first()
    if reminder is None:
        raise YimiError("not_found", "there is no such reminder")
    if not changed and reminder.state == Reminder.State.FIRED:
        raise YimiError("reminder_already_fired", "this reminder has already fired; it cannot be cancelled")
    if changed:
        log_event("reminder_cancelled", reminder_id=str(reminder.id))
    return reminder


def fire_due_reminders(now: datetime | None = None) -> int:
    """Fire every scheduled reminder whose time has come; returns how many fired.

    Per reminder, in one transaction: 1. claim it with ``UPDATE ... WHERE state='scheduled'``
    → fired (a concurrent beat run that loses the claim skips it, so none fires twice);
    2. append a ``notice`` entry (code ``reminder``) to the owner's timeline; 3. link it.
    After commit, the owner's devices get the ``notice`` frame and a ``timeline.new`` hint;
    a device that misses them still finds the entry with ``sync``. A reminder whose append
    fails stays scheduled and is tried again on the next run.
    """
    now = now or timezone.now()
    fired = 0
    failed: set[uuid.UUID] = set()
    while True:
        ids = list(
            Reminder.objects.filter(state=Reminder.State.SCHEDULED, due_at__lte=now)
            .exclude(id__in=failed)
            .order_by("due_at")
            .values_list("id", flat=True)[:FIRE_BATCH]
        )
        if not ids:
            return fired
        for rid in ids:
            try:
                fired += _fire_one(rid, now)
            except Exception as exc:  # noqa: BLE001 - one broken reminder must not block the others
                failed.add(rid)
                log_event("reminder_fire_failed", logging.ERROR, reminder_id=str(rid), error=type(exc).__name__)


def _fire_one(rid: uuid.UUID, now: datetime) -> int:
    with transaction.atomic():
        claimed = Reminder.objects.filter(id=rid, state=Reminder.State.SCHEDULED).update(
            state=Reminder.State.FIRED, fired_at=now
        )
        if not claimed:
            return 0
        reminder = Reminder.objects.get(id=rid)
        entry = append_entry(owner_id=reminder.owner_id, kind="notice", text=NOTICE_PREFIX + reminder.text, notice_code="reminder")
        Reminder.objects.filter(id=rid).update(fired_entry=entry)
        transaction.on_commit(partial(_announce, reminder.owner_id, entry.seq, entry.text))
    log_event("reminder_fired", reminder_id=str(rid), seq=entry.seq)
    return 1


def _announce(owner_id: int, seq: int, text: str) -> None:
    try:
        push.announce_sync(owner_id, seq=seq, code="reminder", text=text)
    except Exception as exc:  # noqa: BLE001 - the entry is committed; devices catch up with sync
        log_event("reminder_announce_failed", logging.WARNING, seq=seq, error=type(exc).__name__)


def serialize_reminder(reminder: Reminder) -> dict[str, Any]:
    def iso(value: datetime | None) -> str | None:
        return value.astimezone(UTC).isoformat() if value is not None else None

    return {
        "id": str(reminder.id),
        "text": reminder.text,
        "due_at": iso(reminder.due_at),
        "state": reminder.state,
        "created_at": iso(reminder.created_at),
        "fired_at": iso(reminder.fired_at),
        "cancelled_at": iso(reminder.cancelled_at),
    }
