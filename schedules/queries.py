"""schedules' hand-built statements: PostgreSQL only (SQLite takes the ORM). Each is built
once per process from ``_meta``."""

from __future__ import annotations

from functools import cache

from django.db import connection

from schedules.models import Watch, WatchNotice
from yimi_project.infra import statements


@cache
def acknowledge_sql() -> tuple[str, str]:
    """An ACKed entry's watch notice: (1) the pending notice of the entry becomes delivered
    (``UPDATE … SET state = %s, delivered_at = %s WHERE entry = %s AND state = %s``), (2) a
    one-time, active watch of that entry's notice ends (``UPDATE … SET active = %s WHERE once
    AND active AND id IN (SELECT watch … WHERE entry = %s)``). On every ACK:
    ``schedules.watches.acknowledge_entry``."""
    n = statements.column_of(WatchNotice)
    w = statements.column_of(Watch)
    quote = connection.ops.quote_name
    return (
        f"UPDATE {quote(WatchNotice._meta.db_table)} SET {n('state')} = %s, {n('delivered_at')} = %s "
        f"WHERE {n('entry')} = %s AND {n('state')} = %s",
        f"UPDATE {quote(Watch._meta.db_table)} SET {w('active')} = %s "
        f"WHERE {w('once')} AND {w('active')} AND {w('id')} IN "
        f"(SELECT {n('watch')} FROM {quote(WatchNotice._meta.db_table)} WHERE {n('entry')} = %s)",
    )
