"""capabilities' hand-built statements: PostgreSQL only (SQLite takes the ORM). Each is built
once per process from ``_meta``. The gateway's decide and receipt use the generic
``yimi_project.infra.statements`` (an INSERT, a fetch by key), built there."""

from __future__ import annotations

from functools import cache

from django.db import connection

from capabilities.models import ToldFact
from yimi_project.infra import statements


@cache
def acknowledge_sql() -> str:
    """The facts an entry carried, not told before, become told: ``UPDATE … SET acknowledged_at
    = %s WHERE acknowledged_at IS NULL AND entry = %s`` (the ORM's ``filter(entry_id=…,
    acknowledged_at__isnull=True).update(acknowledged_at=now)``). On every ACK:
    ``capabilities.services.acknowledge_entry``."""
    c = statements.column_of(ToldFact)
    return (f"UPDATE {connection.ops.quote_name(ToldFact._meta.db_table)} SET {c('acknowledged_at')} = %s "
            f"WHERE {c('acknowledged_at')} IS NULL AND {c('entry')} = %s")
