"""capabilities' hand-built statements (PostgreSQL only), and the parts other apps' statements are assembled from."""

# --- parts for brain (added by the brain helper) ---
# The run's claim and its report read capabilities' receipts; brain's statements
# (brain.queries) are assembled from this part, built once per process from _meta.

from functools import cache
from typing import Any

from django.db import connection

from capabilities.models import ReceiptRecord, ToolCall
from yimi_project.infra import statements


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
