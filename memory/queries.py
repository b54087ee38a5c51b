"""Every hand-built statement of the memory app (docs/decisions/2026-12-03-statements-built-once.md):
the SQL text, each built once per process (``@cache``) from the models' ``_meta``, with a
docstring saying what it does and which transition runs it. The modules that run them
(``memory.timeline.entries``, ``memory.recall``, ``memory.assertions.injection``,
``…projections``, ``…store``, ``…forget_compaction``, ``memory.personal.ambient``,
``memory.locks``) import
them from here; no other module of the app builds SQL text (migrations excepted).

The hot statements run on PostgreSQL only; SQLite (the embedded default, one person) takes
the ORM in the running module. What runs on both databases, or on one by nature, says so:
the dependency walks (recursive CTEs both run), the keyword search (each database's own
text functions and indexes), forgetting on disk (each database's own table rewrite) and
the owner's locks (``memory.locks``: PostgreSQL's advisory locks; SQLite's write lock).

Parts for other apps' statements (an app above memory assembles its statement from them and
never reads memory's ``_meta``): ``seq_upsert`` (the owner's next sequence number, for
``brain.services``' one-statement admission and reply), ``current_versions`` (the current
version of the owner's active assertions, for ``companion.snapshot``), and for ``brain.queries``:
``entry_part``, ``entry_columns``, ``entry_join``, ``attached_image_exists``, ``entry_insert``,
``next_entry_id`` (a text's admission, a run's claim and close); for ``devices.queries``:
``entry_of_seq`` (an ACK's delivery).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

from django.db import connection
from django.db.models import Field

from memory.assertions.models import Assertion, AssertionDependency, AssertionVersion, MemorySession
from memory.assertions.predicates import PROJECTED_PREDICATES
from memory.personal.models import AmbientRecord, ImageRecord
from memory.timeline.models import TimelineCounter, TimelineEntry
from yimi_project.infra import statements

Fields = tuple["Field[Any, Any]", ...]


def _quote(name: str) -> str:
    return connection.ops.quote_name(name)


# --- the timeline (memory.timeline.entries) -----------------------------------------------------


def seq_upsert(owner_id: int, *, only_with: str | None = None) -> tuple[str, list[Any]]:
    """The owner's next sequence number as a query for a data-modifying WITH (its one column
    is ``value``) and its parameters (PostgreSQL): a caller that stores an entry together
    with other rows in one statement (``statements.insert_parts``, the entry's part computing
    ``seq``) takes the number with it, as ``memory.timeline.entries.append_entry`` does
    (``statements.insert_with``) and ``brain.services.accept_utterance`` and ``finish_run``.
    ``only_with``: the name of another WITH query of that statement; the number is taken
    only if it returned a row (``finish_run``: only if the run was still the caller's to
    close). The upsert locks the counter row until the transaction ends."""
    return next_seq_sql(only_with), [owner_id]


@cache
def next_seq_sql(only_with: str | None = None) -> str:
    """``seq_upsert``'s text; alone (``only_with`` None) also ``memory.timeline.entries.next_seq``'s
    statement on PostgreSQL: create the counter row if missing, increment and lock it, return
    the new number."""
    table = _quote(TimelineCounter._meta.db_table)
    c = statements.column_of(TimelineCounter)
    values = "VALUES (%s, 1)" if only_with is None else f"SELECT %s, 1 FROM {only_with}"
    return (
        f"INSERT INTO {table} ({c('owner')}, {c('last_seq')}) {values} "
        f"ON CONFLICT ({c('owner')}) DO UPDATE SET {c('last_seq')} = {table}.{c('last_seq')} + 1 "
        f"RETURNING {c('last_seq')} AS value"
    )


@cache
def recent_entries_sql() -> tuple[str, Fields]:
    """``memory.timeline.entries.recent_for_context`` (every run's history): the owner's
    utterances and replies before a seq, newest first, at most a limit; every column.
    Parameters: owner id, before seq, the two kinds, the limit."""
    fields = tuple(TimelineEntry._meta.concrete_fields)
    c = statements.column_of(TimelineEntry)
    sql = (f"SELECT {statements.columns(fields)} FROM {_quote(TimelineEntry._meta.db_table)} "
           f"WHERE {c('owner')} = %s AND {c('seq')} < %s AND {c('kind')} IN (%s, %s) ORDER BY {c('seq')} DESC LIMIT %s")
    return sql, fields


# --- keyword search (memory.recall) -------------------------------------------------------------
# Both databases run it, each with its own text functions: PostgreSQL's strpos/ILIKE and its
# trigram and bigram indexes, SQLite's instr/LIKE (the databases differ by nature here).

TRIGRAM_INDEX_SQL = "SELECT 1 FROM pg_indexes WHERE indexname = 'memory_timeline_text_trgm'"
"""``memory.recall.keyword_backend``: whether the trigram index (migration 0003) exists (PostgreSQL)."""


def keyword_search_sql(
    terms: tuple[tuple[bool, float], ...], *, postgres: bool, restrict: str = "", prefilter: tuple[int, bool] | None = None,
) -> str:
    """``memory.recall.keyword_search``'s statement: the owner's entry ids whose score is above
    0, best first (one term: newest first alone), the score computed once per row in a
    subquery. ``terms``: (has letters, weight) per term; one with letters matches
    case-insensitively (``ILIKE`` on PostgreSQL, ``LIKE`` on SQLite), one without by position
    (``strpos``/``instr``). ``restrict``: an ``IN`` subquery of entry ids or "". ``prefilter``
    (PostgreSQL): (the number of Latin terms, whether there are CJK bigrams), an indexed
    condition true for exactly the rows containing any term: ``ILIKE`` per Latin term
    (the trigram index, migration 0003) OR the bigram ``tsvector`` matching a ``tsquery``
    (migration 0005). Parameters: each term's, the owner id, the restriction's, each Latin
    term's and the ``tsquery``, the limit. Built per query (its shape follows the terms)."""
    contains = "strpos(text, %s) > 0" if postgres else "instr(text, %s) > 0"
    like = "text ILIKE %s ESCAPE '\\'" if postgres else "text LIKE %s ESCAPE '\\'"
    scores = [f"(CASE WHEN {like if letters else contains} THEN {weight} ELSE 0 END)" for letters, weight in terms]
    where = " AND id IN (" + restrict + ")" if restrict else ""
    if prefilter is not None:
        latin, bigrams = prefilter
        conditions = [like] * latin + (["text_cjk_bigrams @@ %s::tsquery"] if bigrams else [])
        where += " AND (" + " OR ".join(conditions) + ")"
    # One term: every match scores the same, so newest first is the whole order, and
    # PostgreSQL may walk (owner, seq) backwards and stop at the limit's matches instead of
    # scoring every match of a common term (bench/memory.py: 85 ms -> 0.3 ms for a 2-character
    # word in a quarter of 100,000 entries).
    order = "score DESC, seq DESC" if len(terms) > 1 else "seq DESC"
    return (
        f"SELECT id FROM (SELECT id, seq, ({' + '.join(scores)}) AS score "
        f"FROM {_quote(TimelineEntry._meta.db_table)} WHERE owner_id = %s{where}) AS scored "
        f"WHERE score > 0 ORDER BY {order} LIMIT %s"
    )


# --- assertions (memory.assertions.injection, .projections, .store) -----------------------------


@cache
def visible_facts_sql() -> tuple[str, Fields]:
    """``memory.assertions.injection.visible_facts`` (every owner run): the owner's current
    facts, every column, newest change first, the projected predicates left out. Parameters:
    owner id, the active state, 0, the projected predicates."""
    fields = tuple(Assertion._meta.concrete_fields)
    c = statements.column_of(Assertion)
    projected = ", ".join(["%s"] * len(PROJECTED_PREDICATES))
    sql = (f"SELECT {statements.columns(fields)} FROM {_quote(Assertion._meta.db_table)} "
           f"WHERE {c('owner')} = %s AND {c('state')} = %s AND {c('current_version')} > %s "
           f"AND NOT ({c('predicate')} IN ({projected})) ORDER BY {c('updated_at')} DESC, {c('id')} ASC")
    return sql, fields


@cache
def session_sql() -> tuple[str, Fields]:
    """``memory.assertions.injection.plan`` (every run): the owner's memory session by key,
    every column. Parameters: owner id, key."""
    fields = tuple(MemorySession._meta.concrete_fields)
    c = statements.column_of(MemorySession)
    sql = (f"SELECT {statements.columns(fields)} FROM {_quote(MemorySession._meta.db_table)} "
           f"WHERE {c('owner')} = %s AND {c('key')} = %s")
    return sql, fields


@cache
def accept_session_sql(rebuild: bool) -> str:
    """``memory.assertions.injection.accept``'s compare-and-set UPDATE of a session: baseline,
    blocks, scope, revision + 1, updated_at (a rebuild also counts a generation and keeps its
    reason) where id and revision are as planned. Parameters: baseline, blocks, scope, now,
    [reason,] id, revision."""
    c = statements.column_of(MemorySession)
    sets = [f"{c('baseline')} = %s", f"{c('blocks')} = %s", f"{c('scope')} = %s",
            f"{c('revision')} = ({c('revision')} + 1)", f"{c('updated_at')} = %s"]
    if rebuild:
        sets += [f"{c('generation')} = ({c('generation')} + 1)", f"{c('reset_reason')} = %s"]
    return (f"UPDATE {_quote(MemorySession._meta.db_table)} SET {', '.join(sets)} "
            f"WHERE {c('id')} = %s AND {c('revision')} = %s")


@cache
def projected_sql() -> tuple[str, Fields]:
    """``memory.assertions.projections.render`` (every run checks the L2 files): (predicate,
    current payload) of the owner's active assertions of two predicates, oldest first; one
    whose current version is missing has no payload. Parameters: owner id, the active state,
    the two predicates."""
    a = statements.column_of(Assertion, qualified=True)
    v = statements.column_of(AssertionVersion, qualified=True)
    sql = (
        f"SELECT {a('predicate')}, {v('payload')} FROM {_quote(Assertion._meta.db_table)} "
        f"LEFT OUTER JOIN {_quote(AssertionVersion._meta.db_table)} ON ({v('assertion')} = {a('id')} "
        f"AND {v('version')} = {a('current_version')}) "
        f"WHERE {a('owner')} = %s AND {a('state')} = %s AND {a('predicate')} IN (%s, %s) "
        f"ORDER BY {a('created_at')} ASC, {a('id')} ASC"
    )
    return sql, (Assertion._meta.get_field("predicate"), AssertionVersion._meta.get_field("payload"))


# The two graph walks of memory.assertions.store run on both databases (SQLite has WITH
# RECURSIVE since 3.8.3): a walk has no ORM form, and one query per level would be its fallback.
# UNION (not UNION ALL) makes them stop on cycles.


@cache
def downstream_current_sql() -> str:
    """``memory.assertions.store.downstream_current`` (a commit's marking): the start and every
    active assertion whose current version depends on it, directly or through other current
    versions. Parameter: the start's id."""
    a, d = _quote(Assertion._meta.db_table), _quote(AssertionDependency._meta.db_table)
    return f"""
        WITH RECURSIVE downstream(id) AS (
            SELECT %s
            UNION
            SELECT dep.downstream_id
            FROM {d} dep
            JOIN {a} a ON a.id = dep.downstream_id
                      AND a.current_version = dep.downstream_version
                      AND a.state = 'active'
            JOIN downstream ON dep.upstream_id = downstream.id
        )
        SELECT id FROM downstream
    """


@cache
def affected_by_forgetting_sql() -> str:
    """``memory.assertions.store.affected_by_forgetting`` (a forget and its preview): the start
    and everything that ever depended on it, through any version. Parameter: the start's id."""
    d = _quote(AssertionDependency._meta.db_table)
    return f"""
        WITH RECURSIVE affected(id) AS (
            SELECT %s
            UNION
            SELECT dep.downstream_id
            FROM {d} dep
            JOIN affected ON dep.upstream_id = affected.id
        )
        SELECT id FROM affected
    """


@dataclass(frozen=True)
class CurrentVersions:
    """A part: the current version of each of an owner's active assertions, as a FROM (the
    versions joined with their assertions) and a WHERE (``params``: the owner and the active
    state), with the qualified ``columns`` a statement may select or order by (``assertion``,
    ``predicate``, ``version``, ``payload``, ``updated_at``) and their ``fields`` (to read
    the values back with ``statements.fetch``). Forgotten assertions are never in it."""

    from_sql: str
    where_sql: str
    columns: dict[str, str]
    fields: dict[str, Field[Any, Any]]

    @staticmethod
    def params(owner_id: int) -> list[Any]:
        return [owner_id, Assertion.State.ACTIVE.value]


@cache
def current_versions() -> CurrentVersions:
    """The ``CurrentVersions`` part (``companion.snapshot``'s profile facts at a call start)."""
    v = statements.column_of(AssertionVersion, qualified=True)
    a = statements.column_of(Assertion, qualified=True)
    return CurrentVersions(
        from_sql=(f"{_quote(AssertionVersion._meta.db_table)} INNER JOIN {_quote(Assertion._meta.db_table)} "
                  f"ON ({v('assertion')} = {a('id')})"),
        where_sql=(f"{a('owner')} = %s AND {a('state')} = %s AND {a('current_version')} > 0 "
                   f"AND {v('version')} = {a('current_version')}"),
        columns={"assertion": v("assertion"), "predicate": a("predicate"), "version": v("version"),
                 "payload": v("payload"), "updated_at": a("updated_at")},
        fields={"assertion": AssertionVersion._meta.get_field("assertion"), "predicate": Assertion._meta.get_field("predicate"),
                "version": AssertionVersion._meta.get_field("version"), "payload": AssertionVersion._meta.get_field("payload"),
                "updated_at": Assertion._meta.get_field("updated_at")},
    )


# --- forgetting on disk (memory.assertions.forget_compaction) -----------------------------------
# Each database rewrites its tables its own way (the databases differ by nature here).

CURRENT_XID_SQL = "SELECT xid(pg_current_xact_id())::text"
"""``forget_compaction``'s step 2 (PostgreSQL): a transaction id taken now."""

# Sessions whose transactions began before ``t0`` (our own transaction id at the start): a
# row erased before then may still be visible to them, so VACUUM FULL has to copy it
# ("recently dead"). Any database's writing transaction counts (VACUUM FULL's own snapshot
# holds the oldest running id back), a snapshot only in this database; prepared
# transactions and replication slots hold rows back too.
OLDER_SESSIONS_SQL = """
SELECT 'pid ' || pid || ' (' || coalesce(datname, 'replication') || ', ' || coalesce(state, '?')
       || coalesce(', transaction open since ' || to_char(xact_start, 'YYYY-MM-DD HH24:MI:SS TZ'), '') || ')'
  FROM pg_stat_activity
 WHERE pid <> pg_backend_pid() AND backend_type <> 'autovacuum worker'  -- a lazy vacuum holds no row back
   AND ((backend_xid IS NOT NULL AND age(backend_xid) > age(%(t0)s::xid))
        OR (backend_xmin IS NOT NULL AND age(backend_xmin) > age(%(t0)s::xid)
            AND (datname = current_database() OR datname IS NULL)))
UNION ALL
SELECT 'prepared transaction ' || gid FROM pg_prepared_xacts WHERE age(transaction) > age(%(t0)s::xid)
UNION ALL
SELECT 'replication slot ' || slot_name FROM pg_replication_slots WHERE xmin IS NOT NULL AND age(xmin) > age(%(t0)s::xid)
"""


def vacuum_full_sql(table: str) -> str:
    """``forget_compaction.compact``'s rewrite of one table (PostgreSQL), with its report."""
    return f"VACUUM (FULL, VERBOSE) {_quote(table)}"


CHECKPOINT_SQL = "CHECKPOINT"
SQLITE_SECURE_DELETE_SQL = "PRAGMA secure_delete = ON"
SQLITE_VACUUM_SQL = "VACUUM"
SQLITE_CHECKPOINT_SQL = "PRAGMA wal_checkpoint(TRUNCATE)"


# --- the ambient log (memory.personal.ambient) ----------------------------------------------------


@cache
def recent_ambient_sql() -> tuple[str, Fields]:
    """``memory.personal.ambient.recent`` (every owner run): the columns a line needs of the
    owner's records heard in a window, newest first. Parameters: owner id, from (exclusive),
    to (inclusive)."""
    wanted = {"id", "heard_at", "device_label", "channel", "speaker_scope", "text"}
    fields = tuple(f for f in AmbientRecord._meta.concrete_fields if f.name in wanted)
    c = statements.column_of(AmbientRecord)
    sql = (f"SELECT {statements.columns(fields)} FROM {_quote(AmbientRecord._meta.db_table)} "
           f"WHERE {c('owner')} = %s AND {c('heard_at')} > %s AND {c('heard_at')} <= %s "
           f"ORDER BY {c('heard_at')} DESC, {c('stream_start_sample')} DESC")
    return sql, fields



# --- the owner's locks (memory.locks) -------------------------------------------------------------
# PostgreSQL only, by nature: SQLite has no advisory locks (its BEGIN IMMEDIATE holds the write lock).

ADVISORY_XACT_LOCK_SQL = "SELECT pg_advisory_xact_lock(%s, %s)"
"""``memory.locks.lock_owner``: the owner's lock in a space until the transaction ends. Parameters: space, owner id."""
ADVISORY_TRY_LOCK_SQL = "SELECT pg_try_advisory_lock(%s, %s)"
"""``memory.locks.archive_round_lock``: try the owner's archive round lock (session-level). Parameters: space, owner id."""
ADVISORY_UNLOCK_SQL = "SELECT pg_advisory_unlock(%s, %s)"
"""``memory.locks.archive_round_lock``: release it. Parameters: space, owner id."""


# --- parts for brain.queries (a text's admission, a run's claim and close) ------------------------


def entry_part(entry: TimelineEntry) -> statements.Part:
    """``entry`` (not yet stored) as a row of an ``insert_parts`` statement whose ``computed``
    query is ``seq_upsert``: it takes the owner's next number
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


# --- parts for devices.queries (an ACK's delivery) ---------------------------------------------


@cache
def entry_of_seq(owner: str = "%s", seq: str = "%s") -> tuple[str, str, str]:
    """The owner's timeline entry ``seq`` as parts of a SELECT: its id column, the FROM table
    and the WHERE condition, ``owner`` and ``seq`` being SQL expressions (a placeholder each by
    default, the owner's first). devices' ACK inserts its delivery with ``SELECT <id>, … FROM
    <table> WHERE <condition>`` (``devices.queries.ack_sql``, ``devices.queries.first_delivery_sql``)."""
    column = statements.column_of(TimelineEntry, qualified=True)
    table = connection.ops.quote_name(TimelineEntry._meta.db_table)
    return column("id"), table, f"{column('owner')} = {owner} AND {column('seq')} = {seq}"
