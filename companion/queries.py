"""Every hand-built statement of the companion app (docs/decisions/2026-12-03-statements-built-once.md):
the SQL text of a call start's reads, each built once per process (``@cache``) with a
docstring saying what it does and which transition runs it. They run on PostgreSQL only;
SQLite (the embedded default, one person) takes the ORM in the running module
(``companion.snapshot``, ``companion.topics``, ``companion.privacy_epoch``).

Companion's own tables are read from their ``_meta``; the other apps' come as parts their
``queries`` export: memory's assertions (``memory.queries.current_versions``) and the
owner's time zone (``accounts.queries.user_time_zone``).
"""

from __future__ import annotations

from functools import cache
from typing import Any

from django.db import connection
from django.db.models import Field

from accounts import queries as accounts_queries
from companion.models import CallSnapshot, CallSummary, CompanionSettings, ContentCard, PersonaVersion, PrivacyEpoch, TopicState
from memory import queries as memory_queries
from yimi_project.infra import statements

Fields = tuple["Field[Any, Any]", ...]


def _quote(name: str) -> str:
    return connection.ops.quote_name(name)


@cache
def profile_facts_sql(interests: bool, limit: int) -> tuple[str, Fields]:
    """``companion.snapshot``'s profile facts (a call start): (assertion id, predicate,
    version, payload) of the current version of the owner's active assertions of one
    predicate (the address) and, if ``interests``, of a prefix (LIKE), the address first, then
    newest change first, at most ``limit``; assembled from ``memory.queries.current_versions``.
    Parameters: the address predicate, [the LIKE pattern,] owner id, the active state, the
    address predicate."""
    part = memory_queries.current_versions()
    c = part.columns
    wanted = f"{c['predicate']} = %s"
    if interests:
        wanted = f"({wanted} OR {c['predicate']} LIKE %s)"
    sql = (
        f"SELECT {c['assertion']}, {c['predicate']}, {c['version']}, {c['payload']} "
        f"FROM {part.from_sql} WHERE {wanted} AND {part.where_sql} "
        f"ORDER BY CASE WHEN {c['predicate']} = %s THEN 0 ELSE 1 END ASC, {c['updated_at']} DESC, {c['assertion']} ASC "
        f"LIMIT {int(limit)}"
    )
    return sql, tuple(part.fields[name] for name in ("assertion", "predicate", "version", "payload"))


@cache
def resolve_sql() -> tuple[str, Fields]:
    """``companion.snapshot._resolve`` (a call start): the owner's effective persona version
    (every column, newest first as ``PersonaVersion.Meta.ordering``) with three scalar
    subqueries: the continuity switch, the time zone (``accounts.queries.user_time_zone``),
    this call's snapshot id. Parameters: owner id, owner id, call id, owner id, True."""
    p = statements.column_of(PersonaVersion, qualified=True)
    s = statements.column_of(CompanionSettings, qualified=True)
    snap = statements.column_of(CallSnapshot, qualified=True)
    time_zone, time_zone_field = accounts_queries.user_time_zone()
    persona = tuple(PersonaVersion._meta.concrete_fields)
    fields = (*persona, CompanionSettings._meta.get_field("continuity_enabled"), time_zone_field, CallSnapshot._meta.get_field("id"))
    sql = (
        f"SELECT {statements.columns(persona, qualified=True)}, "
        f"(SELECT {s('continuity_enabled')} FROM {_quote(CompanionSettings._meta.db_table)} WHERE {s('owner')} = %s LIMIT 1), "
        f"{time_zone}, "
        f"(SELECT {snap('id')} FROM {_quote(CallSnapshot._meta.db_table)} WHERE {snap('call')} = %s LIMIT 1) "
        f"FROM {_quote(PersonaVersion._meta.db_table)} WHERE {p('owner')} = %s AND {p('effective')} = %s "
        f"ORDER BY {p('owner')} ASC, {p('version')} DESC LIMIT 1"
    )
    return sql, fields  # type: ignore[return-value]


@cache
def recent_openings_sql(limit: int) -> tuple[str, Fields]:
    """``companion.snapshot._build`` (a call start): the owner's last calls' (opening key, card
    id), built ones only, this call left out, newest first, at most ``limit``. Parameters:
    owner id, False, call id."""
    c = statements.column_of(CallSnapshot)
    meta = CallSnapshot._meta
    sql = (f"SELECT {c('opening_key')}, {c('card')} FROM {_quote(meta.db_table)} "
           f"WHERE {c('owner')} = %s AND {c('fallback')} = %s AND NOT ({c('call')} = %s) "
           f"ORDER BY {c('built_at')} DESC LIMIT {int(limit)}")
    return sql, (meta.get_field("opening_key"), meta.get_field("card"))  # type: ignore[return-value]


@cache
def active_cards_sql() -> tuple[str, Fields]:
    """``companion.snapshot._build`` (a call start): the active content cards, every column,
    by id. Parameter: True."""
    fields = tuple(ContentCard._meta.concrete_fields)
    c = statements.column_of(ContentCard)
    sql = (f"SELECT {statements.columns(fields)} FROM {_quote(ContentCard._meta.db_table)} "
           f"WHERE {c('active')} = %s ORDER BY {c('id')} ASC")
    return sql, fields


@cache
def current_states_sql(names: tuple[str, ...], exclude_call: bool) -> tuple[str, Fields]:
    """``companion.topics.current_states`` (a call start, a summary): each topic's newest valid
    row (the fields ``names``), one per topic with DISTINCT ON from the (owner, topic_key)
    index, optionally leaving one call's rows out (as the ORM's ``exclude``: a row without a
    call stays). Parameters: owner id[, call id]."""
    meta = TopicState._meta
    c = statements.column_of(TopicState)
    fields = tuple(meta.get_field(name) for name in names)
    where = f"{c('owner')} = %s AND {c('invalidated_at')} IS NULL"
    if exclude_call:
        where += f" AND NOT ({c('source_call')} = %s AND {c('source_call')} IS NOT NULL)"
    sql = (f"SELECT DISTINCT ON ({c('topic_key')}) {', '.join(c(name) for name in names)} FROM {_quote(meta.db_table)} "
           f"WHERE {where} ORDER BY {c('topic_key')} ASC, {c('created_at')} DESC, {c('id')} DESC")
    return sql, fields  # type: ignore[return-value]


@cache
def recent_summaries_sql(limit: int) -> tuple[str, Fields]:
    """``companion.topics.continuity_for`` (a call start): the owner's newest valid summaries'
    (text, facts), at most ``limit``. Parameter: owner id."""
    meta = CallSummary._meta
    c = statements.column_of(CallSummary)
    sql = (f"SELECT {c('text')}, {c('facts')} FROM {_quote(meta.db_table)} "
           f"WHERE {c('owner')} = %s AND {c('invalidated_at')} IS NULL "
           f"ORDER BY {c('created_at')} DESC, {c('id')} DESC LIMIT {int(limit)}")
    return sql, (meta.get_field("text"), meta.get_field("facts"))  # type: ignore[return-value]


@cache
def locked_epoch_sql() -> str:
    """``companion.privacy_epoch.read_locked`` (a call start, a summary's write): the owner's
    epoch value with its row locked ``FOR NO KEY UPDATE`` (the ORM's
    ``select_for_update(no_key=True)``). Parameter: owner id."""
    c = statements.column_of(PrivacyEpoch)
    return (f"SELECT {c('value')} FROM {_quote(PrivacyEpoch._meta.db_table)} "
            f"WHERE {c('owner')} = %s LIMIT 1 FOR NO KEY UPDATE")
