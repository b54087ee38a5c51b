"""The timeline (L4): the code that writes ``TimelineEntry`` and ``TimelineCounter``. Two
callers on the hot text path insert an entry inside a statement of their own, taking its
number with this module's ``seq_upsert``: ``brain.services.accept_utterance`` (a text with its
admission and run; ``accept_voice_utterance`` the same for speech) and
``brain.services.finish_run`` (a reply while closing its run);
docs/decisions/2026-12-03-query-budgets.md. ``releases.notices.notify_owner`` creates and
locks the owner's counter row itself before ``append_entry``, to write a release notice once;
``memory.timeline.erasure`` erases entries (their text, for good).

Sequence numbers are per owner, strictly increasing and gapless. ``append_entry`` takes
the owner's next number with one upsert of the owner's counter row (``INSERT ... ON
CONFLICT DO UPDATE ... RETURNING``) inside the transaction that stores the entry; the
upsert locks that row until the transaction ends, so two devices appending at once queue
on it: neither can read the same ``last_seq``, and a rolled-back append rolls its number
back too (no gap).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

from django.db import connection, transaction
from django.db.models import Max, Q, QuerySet

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
    counter row in one statement); 2. insert the entry with it. Both commit or neither
    does. On PostgreSQL both are one statement (the counter's upsert as a data-modifying
    WITH query, ``statements.insert_with``); elsewhere two. They were five (get_or_create,
    SELECT FOR UPDATE, UPDATE, and a savepoint around them) and an append is on every
    utterance's and reply's way.
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
    if not statements.insert_with(entry, "seq", *seq_upsert(owner_id)):
        entry.seq = next_seq(owner_id)
        statements.insert(entry)
    return entry


def seq_upsert(owner_id: int, *, only_with: str | None = None) -> tuple[str, list[Any]]:
    """``next_seq``'s statement as a query for a data-modifying WITH (its one column is
    ``value``) and its parameters: a caller that stores an entry together with other rows
    in one statement (``statements.insert_parts``, the entry's part computing ``seq``) takes
    the owner's next number with it, as ``append_entry`` does. ``only_with``: the name of
    another WITH query of that statement; the number is taken only if it returned a row
    (``brain.services.finish_run``: only if the run was still the caller's to close)."""
    return _next_seq_statement(transaction.get_connection().ops.quote_name, only_with), [owner_id]


def next_seq(owner_id: int) -> int:
    """The owner's next sequence number, taken inside the caller's transaction: the counter
    row is created if missing, incremented and locked (until the transaction ends) by one
    upsert on PostgreSQL and SQLite (3.35+: RETURNING); elsewhere the same in three ORM
    statements."""
    connection = transaction.get_connection()
    if connection.vendor in ("postgresql", "sqlite"):
        with connection.cursor() as cursor:
            cursor.execute(_next_seq_statement(connection.ops.quote_name), [owner_id])
            row = cursor.fetchone()
        assert row is not None
        return int(row[0])
    TimelineCounter.objects.get_or_create(owner_id=owner_id)
    counter = TimelineCounter.objects.select_for_update().get(owner_id=owner_id)
    counter.last_seq += 1
    counter.save(update_fields=["last_seq"])
    return counter.last_seq


@cache
def _next_seq_statement(quote: Any, only_with: str | None = None) -> str:
    table = quote(TimelineCounter._meta.db_table)
    values = "VALUES (%s, 1)" if only_with is None else f"SELECT %s, 1 FROM {only_with}"
    return (
        f"INSERT INTO {table} (owner_id, last_seq) {values} "
        f"ON CONFLICT (owner_id) DO UPDATE SET last_seq = {table}.last_seq + 1 RETURNING last_seq AS value"
    )


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
    every run: its SELECT built once per process, ``_recent_sql``)."""
    sql, fields = _recent_sql(connection.vendor)
    params = [owner_id, before_seq, TimelineEntry.Kind.UTTERANCE, TimelineEntry.Kind.REPLY, int(limit)]
    return statements.fetch_instances(TimelineEntry, sql, params, fields)[::-1]


@cache
def _recent_sql(vendor: str) -> tuple[str, tuple[Any, ...]]:
    quote = connection.ops.quote_name
    fields = tuple(TimelineEntry._meta.concrete_fields)

    c = statements.column_of(TimelineEntry)

    sql = (f"SELECT {statements.columns(fields)} FROM {quote(TimelineEntry._meta.db_table)} "
           f"WHERE {c('owner')} = %s AND {c('seq')} < %s AND {c('kind')} IN (%s, %s) ORDER BY {c('seq')} DESC LIMIT %s")
    return sql, fields


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
