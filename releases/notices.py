"""Telling the owner what happened to a release: a system notice on the timeline, sent to
their devices. Idempotent by a notice id: the watchdog sends a pending notice again with
the same id after an interruption, and the owner still reads it once."""

from __future__ import annotations

import hashlib
import logging

from django.db import transaction

from accounts.services import get_owner
from memory.models import TimelineCounter, TimelineEntry
from memory.timeline.entries import append_entry
from yimi_project import push
from yimi_project.logs import log_event


def _client_id(notice_id: str) -> str:
    return "release:" + hashlib.sha256(notice_id.encode()).hexdigest()[:40]


def notify_owner(notice_id: str, code: str, text: str, *, owner_id: int | None = None) -> TimelineEntry | None:
    """Append the notice to the owner's timeline unless a notice with this id is there
    already (checked under the owner's timeline counter lock, so two senders write one),
    and push it to the owner's devices after commit. None when there is no owner yet."""
    if owner_id is None:
        owner = get_owner()
        if owner is None:
            return None
        owner_id = owner.id
    client_id = _client_id(notice_id)
    with transaction.atomic():
        TimelineCounter.objects.get_or_create(owner_id=owner_id)
        TimelineCounter.objects.select_for_update().get(owner_id=owner_id)
        entry = TimelineEntry.objects.filter(owner_id=owner_id, device=None, client_id=client_id).first()
        if entry is not None:
            return entry
        entry = append_entry(
            owner_id=owner_id, kind=TimelineEntry.Kind.NOTICE, text=text, client_id=client_id, scope="owner",
            notice_code=code[:32],
        )
        seq, short_code = entry.seq, code[:32]
        transaction.on_commit(lambda: _push(owner_id, seq, short_code, text, client_id))
    return entry


def _push(owner_id: int, seq: int, code: str, text: str, notice_id: str) -> None:
    try:
        push.announce_sync(owner_id, seq=seq, code=code, text=text, notice_id=notice_id)
    except Exception as exc:  # noqa: BLE001 - the notice is on the timeline; devices pull it by sequence number
        log_event("release_notice_push_failed", logging.WARNING, error=type(exc).__name__)
