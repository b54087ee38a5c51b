"""llm's hand-built statements: PostgreSQL only (SQLite takes the ORM). Each is built once
per process from ``_meta``. The usage row of every model call is the generic
``yimi_project.infra.statements.insert`` (``llm.usage.record_call``), built there."""

from __future__ import annotations

from functools import cache
from typing import Any

from django.db import connection

from llm.models import ModelRole
from yimi_project.infra import statements


@cache
def role_rows_sql(count: int) -> tuple[str, tuple[Any, ...]]:
    """Every column of the ``ModelRole`` rows of ``count`` role names (``WHERE role IN (%s, …)``)
    and their fields. On every run start: ``llm.roles`` (``configured_rows``)."""
    fields = tuple(ModelRole._meta.concrete_fields)
    sql = (f"SELECT {statements.columns(fields)} FROM {connection.ops.quote_name(ModelRole._meta.db_table)} "
           f"WHERE {statements.column(ModelRole, 'role')} IN ({', '.join(['%s'] * count)})")
    return sql, fields
