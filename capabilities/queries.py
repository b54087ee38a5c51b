"""capabilities' hand-built statements: PostgreSQL only (SQLite takes the ORM). Each is built
once per process from ``_meta``. The gateway's decide and receipt use the generic
``yimi_project.infra.statements`` (an INSERT, a fetch by key), built there."""

from __future__ import annotations

from functools import cache
from typing import Any

from django.db import connection

from capabilities.models import ReceiptRecord, ToldFact, ToolCall
from yimi_project.infra import statements

# Parts of other apps' statements: the run's claim and its report read the receipts
# (brain.queries assembles them).

@cache
def pack_receipt_tasks(run: str) -> tuple[str, tuple[Any, ...], tuple[Any, ...]]:
    """The SELECT of the task ids of the pack receipts (not the gateway's blocks or asks) of
    the tool calls of the run whose key is the SQL expression ``run``, its parameters and the
    field of its one column: the run's report (``brain.queries.receipt_tasks_sql``) and, as an
    ``EXISTS``, a fact of the run's claim (``brain.queries.claim_sql``)."""
    r, c = statements.column_of(ReceiptRecord, qualified=True), statements.column_of(ToolCall, qualified=True)
    quote = connection.ops.quote_name
    sql = (
        f"SELECT {r('task_id')} FROM {quote(ReceiptRecord._meta.db_table)} INNER JOIN {quote(ToolCall._meta.db_table)} "
        f"ON ({r('call')} = {c('id')}) WHERE {c('run')} = {run} AND {r('written_by_gateway')} = %s"
    )
    return sql, (False,), (ReceiptRecord._meta.get_field("task_id"),)


@cache
def acknowledge_sql() -> str:
    """The facts an entry carried, not told before, become told: ``UPDATE … SET acknowledged_at
    = %s WHERE acknowledged_at IS NULL AND entry = %s`` (the ORM's ``filter(entry_id=…,
    acknowledged_at__isnull=True).update(acknowledged_at=now)``). On every ACK:
    ``capabilities.services.acknowledge_entry``."""
    c = statements.column_of(ToldFact)
    return (f"UPDATE {connection.ops.quote_name(ToldFact._meta.db_table)} SET {c('acknowledged_at')} = %s "
            f"WHERE {c('acknowledged_at')} IS NULL AND {c('entry')} = %s")
