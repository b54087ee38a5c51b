"""The owner's privacy epoch and the continuity switch (issue 21).

The epoch is one counter per owner (``PrivacyEpoch``) that only moves forward. It moves
when a memory source is forgotten, edited or erased (memory calls ``on_source_change``
through ``memory.source_changes``, inside its own transaction) and when the owner turns
continuity off. Everything the companion derives from memory records the epoch it was
read under: a call snapshot, a summary, a topic row, an asynchronous job's result. A
value older than ``current`` is invalid at once, with no sweep needed; a job compares
before it writes (``is_current``).

Invalidators (``register_invalidator``) are called inside the bump's transaction, so
derived rows (e.g. the topics' summaries) are marked in the same commit as the change.

The only code that writes ``PrivacyEpoch`` and ``CompanionSettings``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.db import connection, transaction
from django.db.models import F
from django.db.transaction import TransactionManagementError
from django.utils import timezone

from companion import queries
from companion.models import CompanionSettings, PrivacyEpoch
from memory import source_changes
from yimi_project.errors import YimiError
from yimi_project.infra import statements
from yimi_project.logs import log_event

CONTINUITY_OFF = "continuity_off"
MAX_REASON = 64

# (owner id, new epoch value, reason, the memory change or None) → None
Invalidator = Callable[[int, int, str, "source_changes.SourceChange | None"], None]
_INVALIDATORS: dict[str, Invalidator] = {}


def register_invalidator(name: str, invalidator: Invalidator) -> None:
    """``invalidator`` runs inside every bump's transaction (e.g. to mark summaries)."""
    _INVALIDATORS[name] = invalidator


def _row(owner_id: int) -> PrivacyEpoch:
    row, _ = PrivacyEpoch.objects.get_or_create(owner_id=owner_id)
    return row


def current(owner_id: int) -> int:
    """The owner's epoch now (0 until it first moves)."""
    value = PrivacyEpoch.objects.filter(owner_id=owner_id).values_list("value", flat=True).first()
    return int(value or 0)


def is_current(owner_id: int, epoch: int) -> bool:
    """True when something derived under ``epoch`` may still be used or written back."""
    return current(owner_id) == epoch


def read_locked(owner_id: int) -> int:
    """The epoch, with its row locked (``FOR NO KEY UPDATE`` on PostgreSQL) until the
    caller's transaction ends: a bump waits, so whatever the caller reads meanwhile belongs
    to this epoch (two snapshot builds of one owner also take turns; each takes
    milliseconds). Must run inside ``transaction.atomic``.

    One query once the row exists (every owner's after its first call start): the locking
    SELECT itself (on PostgreSQL its text built once per process, ``companion.queries.locked_epoch_sql``:
    no ORM compile on the way of a call start; SQLite takes the ORM, its ``BEGIN IMMEDIATE``
    already holding the write lock); only a missing row is created first
    (``get_or_create``) and read again."""
    value = _locked_value(owner_id)
    if value is None:
        _row(owner_id)
        value = _locked_value(owner_id)
    assert value is not None
    return int(value)


def _locked_value(owner_id: int) -> Any:
    if not statements.on_postgresql():
        return PrivacyEpoch.objects.select_for_update(no_key=True).filter(owner_id=owner_id).values_list("value", flat=True).first()
    if connection.get_autocommit():
        raise TransactionManagementError("select_for_update cannot be used outside of a transaction.")
    rows = statements.fetch(queries.locked_epoch_sql(), [owner_id], ())
    return rows[0][0] if rows else None


def bump(owner_id: int, reason: str, *, change: source_changes.SourceChange | None = None) -> int:
    """Move the owner's epoch by one and run the invalidators; returns the new value.

    Steps, in one transaction (the caller's, if it has one): 1. make sure the row exists;
    2. ``UPDATE ... SET value = value + 1`` (a concurrent bump waits on the row lock, so
    two bumps give two values, never one); 3. read the new value; 4. every registered
    invalidator runs with it. A failing invalidator rolls the bump (and the caller's
    change) back.
    """
    reason = (reason or "unspecified")[:MAX_REASON]
    with transaction.atomic():
        _row(owner_id)
        PrivacyEpoch.objects.filter(owner_id=owner_id).update(value=F("value") + 1, changed_at=timezone.now(), reason=reason)
        value = current(owner_id)
        for _, invalidator in sorted(_INVALIDATORS.items()):
            invalidator(owner_id, value, reason, change)
    log_event("privacy_epoch_moved", owner=owner_id, epoch=value, reason=reason)
    return value


def on_source_change(change: source_changes.SourceChange) -> None:
    """Memory's listener (registered in ``CompanionConfig.ready``): every forget, edit or erase moves the epoch."""
    bump(change.owner_id, change.reason, change=change)


def continuity_enabled(owner_id: int) -> bool:
    value = CompanionSettings.objects.filter(owner_id=owner_id).values_list("continuity_enabled", flat=True).first()
    return True if value is None else bool(value)


def set_continuity(owner_id: int, enabled: Any) -> bool:
    """Turn the owner's continuity on or off; returns whether it changed. Turning it off
    moves the epoch in the same transaction (every summary, topic row and snapshot built
    with continuity becomes invalid at once); turning it on does not."""
    if not isinstance(enabled, bool):
        raise YimiError("invalid_request", "enabled must be true or false")
    with transaction.atomic():
        settings_row, _ = CompanionSettings.objects.select_for_update().get_or_create(owner_id=owner_id)
        if settings_row.continuity_enabled == enabled:
            return False
        CompanionSettings.objects.filter(id=settings_row.id).update(continuity_enabled=enabled, updated_at=timezone.now())
        if not enabled:
            bump(owner_id, CONTINUITY_OFF)
    log_event("companion_continuity_set", owner=owner_id, enabled=enabled)
    return True
