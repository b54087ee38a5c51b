"""The timeline (L4): the code that writes ``TimelineEntry`` and ``TimelineCounter``. Two
callers on the hot text path insert an entry inside a statement of their own, taking its
number with ``memory.queries.seq_upsert``: ``brain.services.accept_utterance`` (a text with its
admission and run; ``accept_voice_utterance`` the same for speech) and
``brain.services.finish_run`` (a reply while closing its run);
docs/decisions/2026-12-03-query-budgets.md. ``releases.notices.notify_owner`` creates and
locks the owner's counter row itself before ``append_entry``, to write a release notice once;
``memory.timeline.erasure`` erases entries (their text, for good).

Sequence numbers are per owner, strictly increasing and gapless. ``append_entry`` takes
the owner's next number inside the transaction that stores the entry, on PostgreSQL with
one upsert of the owner's counter row (``INSERT ... ON CONFLICT DO UPDATE ... RETURNING``),
on SQLite with the ORM (``SELECT ... FOR UPDATE`` and ``UPDATE``; SQLite holds its write
lock anyway); either way the row stays locked until the transaction ends, so two devices
appending at once queue on it: neither can read the same ``last_seq``, and a rolled-back
append rolls its number back too (no gap).

The statements this module runs on PostgreSQL are built in ``memory.queries``; SQLite takes
the ORM.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.db.models import Max, Q, QuerySet

from memory import queries
from memory.timeline.models import TimelineCounter, TimelineEntry
from yimi_project.errors import YimiError
from yimi_project.infra import statements


# Atomic without a savepoint of its own: every caller appends inside its own transaction
# (or none) and lets an error end it; a savepoint would cost two round trips per append.
@transaction.atomic(savepoint=False)
def append_entry(
    *,
    owner_id: int,
    kind: str,
    text: str,
    device_id: Any = None,
    client_id: str | None = None,
    scope: str = "",
    reply_to: TimelineEntry | None = None,
    notice_code: str = "",
) -> TimelineEntry:
    """Store one entry with the owner's next sequence number.

    Steps: 1. take the owner's next number (``next_seq``: create, lock and increment the
    counter row); 2. insert the entry with it. Both commit or neither does. On PostgreSQL
    both are one statement (the counter's upsert as a data-modifying WITH query,
    ``statements.insert_with``): they were five (get_or_create, SELECT FOR UPDATE, UPDATE,
    and a savepoint around them) and an append is on every utterance's and reply's way.
    SQLite takes the ORM's way (``next_seq``, then the INSERT).
    """
    entry = TimelineEntry(
        owner_id=owner_id,
        seq=0,  # the counter's next number, below
        kind=kind,
        text=text,
        device_id=device_id,
        client_id=client_id,
        scope=scope,
        reply_to=reply_to,
        notice_code=notice_code,
    )
    if not statements.insert_with(entry, "seq", *queries.seq_upsert(owner_id)):
        entry.seq = next_seq(owner_id)
        statements.insert(entry)
    return entry


def next_seq(owner_id: int) -> int:
    """The owner's next sequence number, taken inside the caller's transaction: the counter
    row is created if missing, incremented and locked (until the transaction ends), on
    PostgreSQL by one upsert (``memory.queries.next_seq_sql``); elsewhere (SQLite takes the
    ORM) the same in three ORM statements."""
    connection = transaction.get_connection()
    if statements.on_postgresql():
        with connection.cursor() as cursor:
            cursor.execute(queries.next_seq_sql(), [owner_id])
            row = cursor.fetchone()
        assert row is not None
        return int(row[0])
    TimelineCounter.objects.get_or_create(owner_id=owner_id)
    counter = TimelineCounter.objects.select_for_update().get(owner_id=owner_id)
    counter.last_seq += 1
    counter.save(update_fields=["last_seq"])
    return counter.last_seq


def find_by_client_id(device_id: Any, client_id: str) -> TimelineEntry | None:
    return TimelineEntry.objects.filter(device_id=device_id, client_id=client_id).first()


def visible_entries(*, owner_id: int, only_device_id: Any = None) -> QuerySet[TimelineEntry]:
    """The owner's timeline entries; with ``only_device_id`` (a guest device) only what
    that device said and what was said back to it. The one rule for what a guest sees."""
    qs = TimelineEntry.objects.filter(owner_id=owner_id)
    if only_device_id is not None:
        qs = qs.filter(Q(device_id=only_device_id) | Q(reply_to__device_id=only_device_id))
    return qs


def last_seq(owner_id: int, *, only_device_id: Any = None) -> int:
    """The owner's latest sequence number; for a guest device, the latest it may see."""
    if only_device_id is not None:
        return visible_entries(owner_id=owner_id, only_device_id=only_device_id).aggregate(m=Max("seq"))["m"] or 0
    return TimelineCounter.objects.filter(owner_id=owner_id).values_list("last_seq", flat=True).first() or 0


@dataclass(frozen=True)
class TimelinePage:
    after: int
    entries: list[TimelineEntry]
    has_more: bool

    @property
    def next_after(self) -> int:
        return self.entries[-1].seq if self.entries else self.after


def page_after(*, owner_id: int, after: int, limit: int, only_device_id: Any = None) -> TimelinePage:
    """Entries with ``seq > after`` in order, at most ``limit``.

    ``only_device_id`` restricts the page to what one device said and what was said back
    to it (a guest device never reads the owner's private timeline).
    """
    if after < 0 or limit < 1:
        raise YimiError("invalid_request", "after must be >= 0 and limit >= 1")
    qs = visible_entries(owner_id=owner_id, only_device_id=only_device_id).filter(seq__gt=after)
    rows = list(qs.select_related("reply_to").order_by("seq")[: limit + 1])
    return TimelinePage(after=after, entries=rows[:limit], has_more=len(rows) > limit)


def recent_for_context(*, owner_id: int, before_seq: int, limit: int) -> list[TimelineEntry]:
    """The last ``limit`` utterances and replies before ``before_seq``, oldest first (on
    every run: on PostgreSQL its SELECT built once per process, ``memory.queries.recent_entries_sql``;
    SQLite takes the ORM)."""
    kinds = [TimelineEntry.Kind.UTTERANCE, TimelineEntry.Kind.REPLY]
    if statements.on_postgresql():
        sql, fields = queries.recent_entries_sql()
        newest = statements.fetch_instances(TimelineEntry, sql, [owner_id, before_seq, *kinds, int(limit)], fields)
    else:
        newest = list(TimelineEntry.objects.filter(owner_id=owner_id, seq__lt=before_seq, kind__in=kinds).order_by("-seq")[: int(limit)])
    return newest[::-1]


def serialize_entry(entry: TimelineEntry) -> dict[str, Any]:
    return {
        "seq": entry.seq,
        "kind": entry.kind,
        "text": entry.text,
        "device_id": str(entry.device_id) if entry.device_id else None,
        "scope": entry.scope,
        "reply_to_seq": entry.reply_to.seq if entry.reply_to_id and entry.reply_to else None,
        "notice_code": entry.notice_code or None,
        "created_at": entry.created_at.isoformat(),
    }
