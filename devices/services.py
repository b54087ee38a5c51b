"""Devices: delivery ACKs (the only code that writes ``Delivery``).

On PostgreSQL an ACK is one hot statement (``devices.queries``); elsewhere (SQLite, the
embedded default) the ORM. Pairing, authentication and revocation are device identity:
``accounts.devices``.
"""

from __future__ import annotations

from typing import Any

from django.db import connection
from django.utils import timezone

from accounts.devices import active_device, device_of
from accounts.models import Device
from capabilities.services import acknowledge_entry
from devices.models import Delivery
from devices.queries import ack_sql, first_delivery_sql
from memory.timeline.entries import visible_entries
from schedules.watches import acknowledge_entry as acknowledge_watch_notice
from yimi_project.errors import YimiError
from yimi_project.ids import uuid_or_nil
from yimi_project.infra import statements

# --- delivery ---------------------------------------------------------------------------


SEQ_MIN, SEQ_MAX = -(2**63), 2**63 - 1  # a timeline seq is a 64-bit integer column


def record_delivery(device: Device, seq: Any, status: Any, *, ledgers: bool = True, tried: bool = False) -> Delivery:
    """Record a device's ACK for the timeline entry ``seq``. Idempotent per status.
    ``ledgers=False``: whoever sent the entry's ``reply.done`` said no ledger holds anything
    for it (no told facts: ``brain.runner``), so the told-fact and watch-notice UPDATEs, which
    would match no row, are not sent. ``tried``: ``acknowledge`` already tried the first
    delivery's INSERT and it inserted nothing. On PostgreSQL an owner device's ACK first tries
    that INSERT (``_record_first_delivery``); elsewhere, and when it inserted nothing, the ORM."""
    if status not in Delivery.Status.values:
        raise YimiError("invalid_frame", "status must be rendered (text) or played (speech)")
    if isinstance(seq, bool) or not isinstance(seq, int):
        raise YimiError("invalid_frame", "seq must be an integer")
    if statements.on_postgresql() and not tried and not device.is_guest and SEQ_MIN <= seq <= SEQ_MAX:  # outside: no entry has it
        recorded = _record_first_delivery(device, seq, status)
        if recorded is not None:  # the usual ACK: the first of this status for an entry that exists
            if ledgers:
                acknowledge_entry(recorded.entry_id)
                acknowledge_watch_notice(recorded.entry_id)
            return recorded
    # A guest ACKs only what it may see (its own exchange): it never marks the owner's facts
    # as told, and the answer does not say whether the owner's entry exists.
    entry = (
        visible_entries(owner_id=device.owner_id, only_device_id=device.id if device.is_guest else None)
        .filter(seq=seq)
        .first()
    )
    if entry is None:
        raise YimiError("unknown_entry", f"there is no timeline entry {seq} for this device")
    delivery, _ = Delivery.objects.get_or_create(entry=entry, device=device, status=status)
    if ledgers:
        acknowledge_entry(entry.id)  # the facts this reply carried are now told (capabilities owns that ledger)
        acknowledge_watch_notice(entry.id)  # a watch's pending notice carried by this entry is delivered
    return delivery


def acknowledge(device_id: Any, seq: Any, status: Any, *, ledgers: bool = True, rider: tuple[str, list[Any]] | None = None) -> Device:
    """A device's ACK, with the device re-check every frame gets: ``active_device`` then
    ``record_delivery``, and ``rider`` (a caller's ``UPDATE … WHERE …``, run only with an
    ACK that is taken; the consumer's trace stamp). Returns the device as read.

    On PostgreSQL the usual ACK (an owner device, a valid status and seq, ``rider`` or not) is
    one statement (``devices.queries.ack_sql``): the re-check's SELECT, the delivery's INSERT (only for an
    active owner device) and the rider (only if the INSERT inserted) as data-modifying WITH
    queries. When it inserted nothing (a guest, a repeat, no such entry) ``record_delivery``
    answers as always, without trying the INSERT again, and the rider runs after it, as
    everywhere: an ACK refused writes nothing. They were three statements."""
    valid = status in Delivery.Status.values and isinstance(seq, int) and not isinstance(seq, bool) and SEQ_MIN <= seq <= SEQ_MAX
    if not statements.on_postgresql() or not valid:
        device = active_device(device_id)
        record_delivery(device, seq, status, ledgers=ledgers)
        _ride(rider)
        return device
    sql, fields = ack_sql(rider[0] if rider is not None else None)
    key = Device._meta.get_field("id").get_db_prep_value(uuid_or_nil(device_id), connection)
    given = {"status": status, "at": timezone.now()}  # the INSERT's parameters, in its field order
    values = [f.get_db_prep_save(given[f.name], connection) for f in Delivery._meta.concrete_fields if f.name in given]
    rows = statements.fetch(sql, [key, *values, seq, *(rider[1] if rider is not None else [])], fields)
    device = device_of(rows, fields)  # raises for an unknown or revoked device: nothing was written
    delivery = dict(zip((f.name for f in Delivery._meta.concrete_fields), rows[0][len(fields) - len(Delivery._meta.concrete_fields):]))
    if delivery["id"] is None:  # nothing inserted: a guest, a repeat or no such entry
        record_delivery(device, seq, status, ledgers=ledgers, tried=not device.is_guest)
        _ride(rider)
    elif ledgers:
        acknowledge_entry(delivery["entry"])  # the delivery's entry: its facts are now told
        acknowledge_watch_notice(delivery["entry"])
    return device


def _ride(rider: Any) -> None:
    """Run ``acknowledge``'s rider on its own, after an ACK taken the general way (its ``run``:
    on SQLite the ORM, ``brain.services.TraceStamp``)."""
    if rider is not None:
        rider.run()


def _record_first_delivery(device: Device, seq: int, status: str) -> Delivery | None:
    """An owner device's ACK in one statement: INSERT the delivery of the owner's entry
    ``seq`` (all of the owner's timeline is visible to an owner device: ``visible_entries``
    without ``only_device_id``), doing nothing on the unique (entry, device, status).
    None when no row was inserted — no such entry, or this ACK was recorded before —
    and ``record_delivery`` then answers as the ORM path always did."""
    sql, fields = first_delivery_sql()
    given = {"device": device.id, "status": status, "at": timezone.now()}  # a new column fails here, loudly
    params = [f.get_db_prep_save(given[f.name], connection) for f in fields if f.name not in ("id", "entry")]
    rows = statements.fetch(sql, [*params, device.owner_id, seq], fields)
    return statements.instance(Delivery, fields, rows[0]) if rows else None
