"""memory's hand-built statements (PostgreSQL only), and the parts other apps' statements are assembled from."""

# --- parts for brain (added by the brain helper) ---
# The run's claim, its close and a text's admission touch memory's rows; brain's statements
# (brain.queries) are assembled from these parts, built once per process from _meta.

from functools import cache
from typing import Any

from django.db import connection

from memory.personal.models import ImageRecord
from memory.timeline.models import TimelineEntry
from yimi_project.infra import statements


def entry_part(entry: TimelineEntry) -> statements.Part:
    """``entry`` (not yet stored) as a row of an ``insert_parts`` statement whose ``computed``
    query is ``memory.timeline.entries.seq_upsert``: it takes the owner's next number
    (``brain.queries.accept_parts``: a text's admission)."""
    return statements.Part(entry, computed="seq")


@cache
def entry_columns(alias: str) -> tuple[str, tuple[Any, ...]]:
    """Every column of a ``TimelineEntry`` row named ``alias`` in a statement (a SELECT list,
    ``_meta`` order) and their fields: the claimed run's inbound entry (``brain.queries.claim_sql``)."""
    fields = tuple(TimelineEntry._meta.concrete_fields)
    return ", ".join(f"{alias}.{connection.ops.quote_name(str(f.column))}" for f in fields), fields


@cache
def entry_join(alias: str, key: str) -> str:
    """``INNER JOIN`` of the entry whose id is the SQL expression ``key``, named ``alias``
    (no parameters): the claimed run's inbound entry (``brain.queries.claim_sql``)."""
    table = connection.ops.quote_name(TimelineEntry._meta.db_table)
    return f"INNER JOIN {table} {alias} ON ({alias}.{statements.column(TimelineEntry, 'id')} = {key})"


@cache
def attached_image_exists(device: str, entry: str) -> tuple[str, tuple[Any, ...]]:
    """An ``EXISTS`` that is true when an attached image that still has its file, sent by the
    device whose key is the SQL expression ``device``, names the request of the entry row
    named ``entry`` (its client id), and its parameters: a part of the run's claim
    (``brain.queries.claim_sql``; ``memory.personal.images.image_for_request`` looks only then)."""
    col = statements.column_of(ImageRecord)
    sql = (
        f"EXISTS (SELECT 1 FROM {connection.ops.quote_name(ImageRecord._meta.db_table)} WHERE {col('device')} = {device} "
        f"AND {col('state')} = %s AND NOT ({col('path')} = %s) "
        f"AND {col('about_client_id')} = {entry}.{statements.column(TimelineEntry, 'client_id')})"
    )
    return sql, (ImageRecord.State.ATTACHED, "")


@cache
def entry_insert(key: str, seq: str, sources: str) -> tuple[str, int]:
    """An INSERT of one ``TimelineEntry`` whose id is the SQL expression ``key`` and whose
    ``seq`` is the SQL expression ``seq``, selected ``FROM sources``, returning its id and seq;
    its parameters are ``statements.insert_values(entry)``'s but ``seq``, whose place among
    them is the second value. The close of a run that stores its reply
    (``brain.queries.finish_sql``)."""
    fields = statements.insert_fields(TimelineEntry)
    e = TimelineEntry._meta
    table, pk = connection.ops.quote_name(e.db_table), connection.ops.quote_name(str(e.pk.column))  # type: ignore[union-attr]
    values = ", ".join(seq if f.name == "seq" else "%s" for f in fields)
    sql = (
        f"INSERT INTO {table} ({pk}, {statements.columns(fields)}) SELECT {key}, {values} FROM {sources} "
        f"RETURNING {pk}, {statements.column(TimelineEntry, 'seq')}"
    )
    return sql, next(i for i, f in enumerate(fields) if f.name == "seq")


@cache
def next_entry_id() -> str:
    """The SQL expression that draws the next ``TimelineEntry`` id from its sequence (looked up
    once per process): a statement that must know the entry's id before inserting it (the
    run's close points at its reply: ``brain.queries.finish_sql``)."""
    e = TimelineEntry._meta
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_get_serial_sequence(%s, %s)", [e.db_table, e.pk.column])  # type: ignore[union-attr]
        (sequence,) = cursor.fetchone()  # type: ignore[misc]
    return "nextval('" + str(sequence).replace("'", "''") + "'::regclass)"


# --- parts for devices (added by the devices helper) ---


@cache
def entry_of_seq(owner: str = "%s", seq: str = "%s") -> tuple[str, str, str]:
    """The owner's timeline entry ``seq`` as parts of a SELECT: its id column, the FROM table
    and the WHERE condition, ``owner`` and ``seq`` being SQL expressions (a placeholder each by
    default, the owner's first). devices' ACK inserts its delivery with ``SELECT <id>, … FROM
    <table> WHERE <condition>`` (``devices.queries.ack_sql``, ``devices.queries.first_delivery_sql``)."""
    column = statements.column_of(TimelineEntry, qualified=True)
    table = connection.ops.quote_name(TimelineEntry._meta.db_table)
    return column("id"), table, f"{column('owner')} = {owner} AND {column('seq')} = {seq}"
