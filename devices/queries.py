"""devices' hand-built statements: the ACK's, PostgreSQL only (SQLite takes the ORM:
``devices.services.record_delivery``). Each is built once per process from ``_meta``; the
other apps' tables come in as their parts (accounts' device re-check, memory's entry of a seq)."""

from __future__ import annotations

from functools import cache
from typing import Any

from django.db import connection

from accounts.queries import active_device_sql
from devices.models import Delivery
from memory.queries import entry_of_seq
from yimi_project.infra import statements


@cache
def first_delivery_sql() -> tuple[str, tuple[Any, ...]]:
    """The delivery of the owner's entry ``seq`` INSERTed in one statement, doing nothing on
    the unique (entry, device, status), its row RETURNed; parameters: the device, status and
    at, then the owner and the seq. ``devices.services.record_delivery``'s first try."""
    fields = tuple(Delivery._meta.concrete_fields)  # id, entry, device, status, at
    inserted = [f for f in fields if f.name != "id"]
    entry_id, entries, where = entry_of_seq()
    values = ", ".join(entry_id if f.name == "entry" else "%s" for f in inserted)
    sql = (
        f"INSERT INTO {connection.ops.quote_name(Delivery._meta.db_table)} ({statements.columns(inserted)}) "
        f"SELECT {values} FROM {entries} WHERE {where} "
        f"ON CONFLICT DO NOTHING RETURNING {statements.columns(fields)}"
    )
    return sql, fields


@cache
def ack_sql(rider: str | None) -> tuple[str, tuple[Any, ...]]:
    """``devices.services.acknowledge``'s one statement, built once per rider text (one: the
    trace stamp's): ``dev`` is the device re-check's SELECT (``active_device_sql``, its columns
    renamed c0, c1, …), ``ins`` the delivery's INSERT as ``first_delivery_sql``'s (only for an
    active owner device), ``rider`` the caller's UPDATE, run only if ``ins`` inserted; the
    result is the device's row and the inserted delivery's columns (NULL when none was
    inserted). Parameters: the device's id, the status and at, the seq, the rider's."""
    select, device_fields = active_device_sql()
    delivery_fields = tuple(Delivery._meta.concrete_fields)  # id, entry, device, status, at
    device_column: dict[str, str] = {}
    for i, f in enumerate(device_fields):  # the device's columns first, then its owner's account's
        device_column.setdefault(f.name, f"dev.c{i}")
    named = ", ".join(f"c{i}" for i in range(len(device_fields)))
    entry_id, entries, where = entry_of_seq(owner=device_column["owner"])
    inserted = [f for f in delivery_fields if f.name != "id"]
    values = {"entry": entry_id, "device": device_column["id"], "status": "%s", "at": "%s"}
    sql = (
        f"WITH dev ({named}) AS ({select}), "
        f"ins AS (INSERT INTO {connection.ops.quote_name(Delivery._meta.db_table)} ({statements.columns(inserted)}) "
        f"SELECT {', '.join(values[f.name] for f in inserted)} FROM {entries}, dev "
        f"WHERE {where} AND {device_column['revoked_at']} IS NULL AND NOT {device_column['is_guest']} "
        f"ON CONFLICT DO NOTHING RETURNING {statements.columns(delivery_fields)})"
    )
    if rider is not None:
        sql += f", rider AS ({rider} AND EXISTS (SELECT 1 FROM ins))"
    sql += " SELECT dev.*, ins.* FROM dev LEFT JOIN ins ON TRUE"
    return sql, (*device_fields, *delivery_fields)
