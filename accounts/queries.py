"""accounts' hand-built statements (PostgreSQL only; SQLite takes the ORM), and the parts of
them other apps' statements are assembled from. Each is built once per process from
``_meta``; the modules that run them say when.

- ``active_device_sql``: a device with its owner's account, by id (``accounts.devices.active_device``
  on every frame; the first query of ``devices.services.acknowledge``'s ACK statement).
- ``device_in_call``: whether a device is in an open voice call (a part of
  ``brain.services.claim_for_turn``'s claim).
- ``admission_part``: an ``AdmissionRecord`` as a row of ``statements.insert_parts`` (a part of
  ``brain.services.accept_utterance``'s one statement).
- ``user_time_zone``: a user's time zone as a scalar subquery (a part of a call start's
  ``companion.queries.resolve_sql``).
"""

from __future__ import annotations

from functools import cache
from typing import Any

from django.db import connection
from django.db.models import Field

from accounts.models import AdmissionRecord, Device, User, VoiceCall
from yimi_project.infra import statements


@cache
def active_device_sql() -> tuple[str, tuple[Any, ...]]:
    """The SELECT of every column of a device and of its owner's account (as
    ``select_related("owner")``), by the device's id (one parameter), and the fields of its
    columns in order. ``accounts.devices.active_device`` runs it on every frame (PostgreSQL);
    ``devices.services.acknowledge`` takes it as the part that re-checks the device."""
    quote = connection.ops.quote_name
    d, u = Device._meta, User._meta
    fields = (*d.concrete_fields, *u.concrete_fields)
    sql = (
        f"SELECT {statements.columns(fields, qualified=True)} FROM {quote(d.db_table)} INNER JOIN {quote(u.db_table)} "
        f"ON ({statements.column(Device, 'owner', qualified=True)} = {statements.column(User, 'id', qualified=True)}) "
        f"WHERE {statements.column(Device, 'id', qualified=True)} = %s LIMIT 1"
    )
    return sql, fields


@cache
def device_in_call(device: str) -> str:
    """An ``EXISTS`` that is true while the device whose key is the SQL expression ``device``
    is in an open voice call (no parameters): a part of the run's claim
    (``brain.queries.claim_sql``)."""
    col = statements.column_of(VoiceCall)
    return (
        f"EXISTS (SELECT 1 FROM {connection.ops.quote_name(VoiceCall._meta.db_table)} WHERE {col('device')} = {device} "
        f"AND {col('ended_at')} IS NULL)"
    )


def admission_part(admission: AdmissionRecord) -> statements.Part:
    """``admission`` (made by ``accounts.services.text_admission`` or ``voice_admission``, not yet
    stored) as a row of an ``insert_parts`` statement: the text's admission
    (``brain.queries.accept_parts``)."""
    return statements.Part(admission)


@cache
def user_time_zone() -> tuple[str, Field[Any, Any]]:
    """A part: a scalar subquery of the time zone of the user whose id is its one parameter
    (NULL if there is none), and its field to read the value back
    (``companion.queries.resolve_sql``, a call start)."""
    c = statements.column_of(User, qualified=True)
    sql = f"(SELECT {c('time_zone')} FROM {connection.ops.quote_name(User._meta.db_table)} WHERE {c('id')} = %s LIMIT 1)"
    return sql, User._meta.get_field("time_zone")  # type: ignore[return-value]
