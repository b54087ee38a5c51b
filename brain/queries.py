"""brain's hand-built statements: one hot statement per transition, on PostgreSQL only.

SQLite (the embedded default, serving one person) takes the ORM instead, in the modules
that run these (docs/decisions/2026-12-03-query-budgets.md). Each is built once per process
from ``_meta``; a statement that touches another app's rows is assembled from the parts
that app exports (``accounts.queries``, ``memory.queries``, ``capabilities.queries``,
``memory.queries.seq_upsert``), never from its models' ``_meta``.

- ``accept_parts``: a text's admission, entry and run in one statement (``brain.services.accept_utterance``).
- ``claim_sql``: the run's claim with its inbound entry and its turn's facts (``brain.services.claim_for_turn``).
- ``heartbeat_sql``: the claim's heartbeat (``brain.services.heartbeat``).
- ``finish_sql``: the run's close with its reply or notice (``brain.services.finish_run``).
- ``trace_stages_sql``: the ACK's trace stamp (``brain.services.trace_stages_update``).
- ``active_tasks_sql``: the owner's working background tasks (``brain.agents.active_tasks_for_owner``).
- ``receipt_tasks_sql``: the task ids of a run's pack receipts (``brain.runner.run_tree_report``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any

from django.db import connection

from accounts import queries as accounts_queries
from brain.models import AgentTask, Run
from capabilities import queries as capabilities_queries
from memory import queries as memory_queries
from yimi_project.infra import statements

if TYPE_CHECKING:
    from accounts.models import AdmissionRecord
    from memory.models import TimelineEntry


def accept_parts(
    admission: AdmissionRecord, entry: TimelineEntry, run: Run
) -> tuple[list[statements.Part], str, list[Any]]:
    """A text's admission (``brain.services.accept_utterance``): the ``insert_parts`` rows —
    the admission (``accounts.queries.admission_part``), the entry taking the owner's next
    number (``memory.queries.entry_part``) and the run taking the entry's key — and the
    counter's upsert (``memory.queries.seq_upsert``) with its parameters."""
    parts = [accounts_queries.admission_part(admission), memory_queries.entry_part(entry),
             statements.Part(run, takes=(("inbound", 1),))]
    return parts, *memory_queries.seq_upsert(entry.owner_id)


@dataclass(frozen=True)
class ClaimSQL:
    """``claim_sql``'s statement; ``facts``: the parameters after the UPDATE's, in order."""

    sql: str
    run_fields: tuple[Any, ...]
    entry_fields: tuple[Any, ...]
    facts: tuple[Any, ...]


@cache
def claim_sql(active: tuple[str, ...]) -> ClaimSQL:
    """The run's claim (``brain.services.claim_for_turn``) in one statement: the compare-and-set
    UPDATE (queued, or running on a stale heartbeat → running, attempts + 1, the pin unless the
    run has one; parameters: running, started, heartbeat, pin, the run's key, queued, running,
    the stale cutoff) returns the run's columns, joined with its inbound entry
    (``memory.queries.entry_join``) and four facts: its device is in an open call
    (``accounts.queries.device_in_call``), an attached image names its request
    (``memory.queries.attached_image_exists``), the owner has background tasks in ``active``
    states, the run's tree has pack receipts (``capabilities.queries.pack_receipt_tasks``)."""
    quote = connection.ops.quote_name
    run = statements.column_of(Run)
    t = statements.column_of(AgentTask, qualified=True)
    run_fields = tuple(Run._meta.concrete_fields)
    update = (
        f"UPDATE {quote(Run._meta.db_table)} SET {run('state')} = %s, {run('attempts')} = ({run('attempts')} + 1), "
        f"{run('started_at')} = %s, {run('heartbeat_at')} = %s, {run('model_roles')} = COALESCE({run('model_roles')}, %s) "
        f"WHERE {run('id')} = %s AND ({run('state')} = %s OR ({run('state')} = %s AND {run('heartbeat_at')} < %s)) "
        f"RETURNING {statements.columns(run_fields)}"
    )
    entry_cols, entry_fields = memory_queries.entry_columns("e")
    image, image_params = memory_queries.attached_image_exists("claimed." + run("origin_device"), "e")
    receipts, receipt_params, _ = capabilities_queries.pack_receipt_tasks("claimed." + run("id"))
    tasks = (
        f"EXISTS (SELECT 1 FROM {quote(AgentTask._meta.db_table)} INNER JOIN {quote(Run._meta.db_table)} owned "
        f"ON ({t('run')} = owned.{run('id')}) WHERE owned.{run('owner')} = claimed.{run('owner')} "
        f"AND {t('depth')} = %s AND {t('kind')} = %s AND {t('state')} IN ({', '.join(['%s'] * len(active))}))"
    )
    claimed = ", ".join(f"claimed.{quote(str(f.column))}" for f in run_fields)
    in_call = accounts_queries.device_in_call("claimed." + run("origin_device"))
    sql = (
        f"WITH claimed AS ({update}) SELECT {claimed}, {entry_cols}, {in_call}, {image}, {tasks}, EXISTS ({receipts}) "
        f"FROM claimed {memory_queries.entry_join('e', 'claimed.' + run('inbound'))}"
    )
    facts = (*image_params, 1, AgentTask.Kind.TASK, *active, *receipt_params)
    return ClaimSQL(sql, run_fields, entry_fields, facts)


@cache
def heartbeat_sql() -> str:
    """The claim's heartbeat (``brain.services.heartbeat``): a conditional UPDATE of
    ``heartbeat_at`` (parameters: now, the run's key, running, the attempts as claimed)."""
    c = statements.column_of(Run)
    return (f"UPDATE {connection.ops.quote_name(Run._meta.db_table)} SET {c('heartbeat_at')} = %s "
            f"WHERE {c('id')} = %s AND {c('state')} = %s AND {c('attempts')} = %s")


@cache
def finish_sql(with_trace: bool) -> tuple[str, int]:
    """The run's close (``brain.services.finish_run``, autocommit) in one statement, and the
    place of ``seq`` among the entry's insert values (the statement computes it). ``closed``
    is the closing UPDATE made conditional (parameters: state, finished, error code, the trace
    if ``with_trace``, thinking, then the run's key, running, queued, the attempts as claimed),
    which locks the run row first; only if it closed the run is the owner's next number taken
    (``memory.queries.seq_upsert``, ``only_with``) and the entry inserted
    (``memory.queries.entry_insert``). The entry's key is drawn up front
    (``memory.queries.next_entry_id``), so the UPDATE points at it (``result_entry``, a
    deferred foreign key, checked when the statement commits)."""
    quote = connection.ops.quote_name
    c = statements.column_of(Run)
    upsert, _ = memory_queries.seq_upsert(0, only_with="closed")
    insert, seq_at = memory_queries.entry_insert("ids.id", "computed.value", "ids, computed")
    sets = [c("state"), c("finished_at"), c("error_code"), *([c("trace")] if with_trace else [])]
    sql = (
        f"WITH ids AS (SELECT {memory_queries.next_entry_id()} AS id), "
        f"closed AS (UPDATE {quote(Run._meta.db_table)} SET {', '.join(f'{name} = %s' for name in sets)}, "
        f"{c('thinking')} = COALESCE({c('thinking')}, %s), {c('result_entry')} = (SELECT id FROM ids) "
        f"WHERE {c('id')} = %s AND {c('state')} IN (%s, %s) AND {c('attempts')} = %s RETURNING 1), "
        f"computed AS ({upsert}) {insert}"
    )
    return sql, seq_at


@cache
def trace_stages_sql() -> str:
    """The ACK's trace stamp (``brain.services.trace_stages_update``): an UPDATE that merges a
    JSON object of stages into a run's trace, stages already there overwritten (parameters:
    the JSON, the run's key); its text ends with its WHERE clause, so a condition may be
    appended (``devices.services.acknowledge``'s rider)."""
    trace = statements.column(Run, "trace")
    table = connection.ops.quote_name(Run._meta.db_table)
    return (f"UPDATE {table} SET {trace} = COALESCE({trace}, '{{}}'::jsonb) || %s::jsonb "
            f"WHERE {statements.column(Run, 'id')} = %s")


@cache
def active_tasks_sql(active: tuple[str, ...]) -> tuple[str, tuple[Any, ...]]:
    """The owner's background tasks (depth 1, kind task) in ``active`` states, oldest first
    (``brain.agents.active_tasks_for_owner``, every main turn; parameters: 1, task, the owner,
    the states), and the fields of its columns (every column of ``AgentTask``)."""
    quote = connection.ops.quote_name
    fields = tuple(AgentTask._meta.concrete_fields)
    t = statements.column_of(AgentTask, qualified=True)
    sql = (
        f"SELECT {statements.columns(fields, qualified=True)} "
        f"FROM {quote(AgentTask._meta.db_table)} INNER JOIN {quote(Run._meta.db_table)} "
        f"ON ({t('run')} = {statements.column(Run, 'id', qualified=True)}) "
        f"WHERE {t('depth')} = %s AND {t('kind')} = %s AND {statements.column(Run, 'owner', qualified=True)} = %s "
        f"AND {t('state')} IN ({', '.join(['%s'] * len(active))}) ORDER BY {t('created_at')} ASC"
    )
    return sql, fields


@cache
def receipt_tasks_sql() -> tuple[str, tuple[Any, ...], tuple[Any, ...]]:
    """The task ids of a run's pack receipts (``brain.runner.run_tree_report``, before every
    checked reply): ``capabilities.queries.pack_receipt_tasks`` for the run whose key is the
    first parameter; then its own parameters, and the field of its column."""
    return capabilities_queries.pack_receipt_tasks("%s")
