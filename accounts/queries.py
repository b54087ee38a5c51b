"""Hand-built statements of the accounts app, and the parts of its tables that other apps'
statements are assembled from (docs/decisions/2026-12-03-statements-built-once.md): each
built once per process from the models' ``_meta``, so an app above accounts never reads its
``_meta`` nor names its tables."""

from __future__ import annotations

# --- parts for companion (added by the memory helper) ---
from functools import cache
from typing import Any

from django.db import connection
from django.db.models import Field

from accounts.models import User
from yimi_project.infra import statements


@cache
def user_time_zone() -> tuple[str, Field[Any, Any]]:
    """A part: a scalar subquery of the time zone of the user whose id is its one parameter
    (NULL if there is none), and its field to read the value back
    (``companion.queries.resolve_sql``, a call start)."""
    c = statements.column_of(User, qualified=True)
    sql = f"(SELECT {c('time_zone')} FROM {connection.ops.quote_name(User._meta.db_table)} WHERE {c('id')} = %s LIMIT 1)"
    return sql, User._meta.get_field("time_zone")  # type: ignore[return-value]
