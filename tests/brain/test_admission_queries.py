"""A typed utterance's way in (devices/consumers/timeline.py ``_on_text``, brain.services
``accept_utterance``): its query budget, and sockets that do not wait for each other.

Counted, never timed: in autocommit, as in production, the device re-check (with its
owner's account in the same row) and then, on PostgreSQL, one statement (the admission,
the owner's next sequence number, the entry and the run as data-modifying WITH queries:
``statements.insert_parts``); on SQLite one transaction of BEGIN, the admission, the next
sequence number (the ORM's get_or_create, SELECT FOR UPDATE and UPDATE: SQLite takes the
ORM), the entry, the run and COMMIT. Before issue 14's work it was
13 statements in two database trips (a lookup of the client id first, the owner check
apart, the counter in get_or_create + SELECT FOR UPDATE + UPDATE inside a savepoint).
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from accounts.devices import active_device
from accounts.models import AdmissionRecord, Device, User
from brain.models import Run
from brain.services import accept_utterance
from memory.models import TimelineCounter, TimelineEntry
from tests.conftest import SimDevice, db_async, new_client_id, open_socket, receive_until

pytestmark = pytest.mark.django_db(transaction=True)  # autocommit, as in production

# The budget: raise it only with a reason in docs/decisions/2026-12-03-query-budgets.md.
def admission_queries() -> int:
    if connection.vendor == "postgresql":
        return 2  # device + owner; WITH admission, next seq, entry: INSERT run
    # device + owner, BEGIN, INSERT admission, next seq (3: SQLite takes the ORM: step 3), INSERT entry, INSERT run, COMMIT
    return 9


def admit(device_id: Any, text: str, client_id: str | None = None) -> tuple[Any, list[str]]:
    with CaptureQueriesContext(connection) as queries:
        device = active_device(device_id)
        accepted = accept_utterance(device, client_id or new_client_id(), text)
    return accepted, [q["sql"] for q in queries.captured_queries]


def test_a_typed_utterance_stays_within_the_query_budget(make_device: Any) -> None:
    device = make_device().device
    admit(device.id, "warm")  # first use: the counter row, prepared statements
    accepted, issued = admit(device.id, "counted")
    assert not accepted.duplicate and accepted.entry.seq == 2
    assert len(issued) <= admission_queries(), "\n".join(issued)
    assert not any(sql.startswith(("SAVEPOINT", "RELEASE")) for sql in issued), issued
    if connection.vendor == "postgresql":
        assert not any(sql.startswith(("BEGIN", "COMMIT")) for sql in issued), issued  # one statement: atomic alone
    else:
        assert sum(sql.startswith("BEGIN") for sql in issued) == 1 and issued[-1] == "COMMIT", issued
    run = Run.objects.get(id=accepted.run_id)
    assert (run.inbound_id, run.scope, run.admission.reason) == (accepted.entry.id, "owner", "paired_owner_device")
    stored = TimelineEntry.objects.get(id=accepted.entry.id)  # what the caller holds is what was stored
    assert (stored.seq, stored.text, stored.client_id, stored.device_id, stored.scope) == (
        accepted.entry.seq, "counted", accepted.entry.client_id, device.id, "owner")
    assert run.admission_id == run.admission.id and run.admission.device_id == device.id and run.admission.channel == "text"
    assert run.trace["admitted"] > 0 and run.origin_device_id == device.id and run.owner_id == device.owner_id


def test_inside_a_callers_transaction_a_resend_rolls_back_only_its_own_rows(make_device: Any) -> None:
    """Inside a transaction the rows are written under a savepoint: a resend's failure
    leaves the caller's transaction usable and its earlier work in place."""
    from django.db import transaction

    device = make_device().device
    first, _ = admit(device.id, "hello", "same-id")
    with transaction.atomic():
        again = accept_utterance(active_device(device.id), "same-id", "hello")
        later = accept_utterance(active_device(device.id), new_client_id(), "still works")
    assert again.duplicate and again.entry.id == first.entry.id
    assert not later.duplicate and later.entry.seq == first.entry.seq + 1
    assert AdmissionRecord.objects.filter(device=device).count() == 2


def test_a_resend_returns_the_stored_entry_and_leaves_no_gap(make_device: Any) -> None:
    device = make_device().device
    first, _ = admit(device.id, "hello", "same-id")
    again, _ = admit(device.id, "hello", "same-id")
    assert again.duplicate and (again.entry.id, again.run_id) == (first.entry.id, first.run_id)
    # the resend's transaction rolled back whole: no second admission, and its number was not used
    assert AdmissionRecord.objects.filter(device=device).count() == 1
    nxt, _ = admit(device.id, "next")
    assert nxt.entry.seq == first.entry.seq + 1
    assert list(TimelineEntry.objects.filter(owner_id=device.owner_id).values_list("seq", flat=True).order_by("seq")) == [1, 2]


def test_the_owner_check_reads_the_account_with_the_device(make_device: Any) -> None:
    """The account is read in the device's own query, and still decides: a deactivated
    owner account's device is admitted as guest."""
    device = make_device().device
    admit(device.id, "warm")
    User.objects.filter(id=device.owner_id).update(is_active=False)
    accepted, issued = admit(device.id, "after deactivation")
    assert len(issued) <= admission_queries(), "\n".join(issued)
    run = Run.objects.select_related("admission").get(id=accepted.run_id)
    assert (run.scope, run.admission.reason) == ("guest", "not_owner_device")


def test_a_guest_device_is_admitted_as_guest_within_the_budget(make_device: Any) -> None:
    guest = make_device(guest=True).device
    admit(guest.id, "warm")
    accepted, issued = admit(guest.id, "counted")
    assert len(issued) <= admission_queries(), "\n".join(issued)
    assert Run.objects.get(id=accepted.run_id).scope == "guest"


def other_account_device(make_device: Any) -> SimDevice:
    """A device of another account of this instance (the bench's stand-in for another
    owner, bench/roundtrip.py): its own timeline, its own counter row."""
    sim = make_device()
    account = User.objects.create_user(username=f"other-{new_client_id()[:8]}", password=new_client_id())
    Device.objects.filter(id=sim.device.id).update(owner=account)
    sim.device.refresh_from_db()
    return sim


async def test_one_sockets_blocked_admission_does_not_hold_up_another_socket(make_device: Any, brain: Any) -> None:
    """Each socket's database work runs on a thread of its own: while the admission of
    device A waits on a row lock (another session holds A's owner's timeline counter), the
    text of device B (another account) is admitted and acknowledged; then A's goes through.
    On one shared database thread B would queue behind A until the lock went away."""
    if connection.vendor != "postgresql":
        pytest.skip("row locks are a PostgreSQL behaviour; SQLite serializes whole write transactions")
    a, b = await db_async(make_device)(), await db_async(other_account_device)(make_device)
    await db_async(TimelineCounter.objects.get_or_create)(owner_id=a.device.owner_id)
    sock_a, _ = await open_socket(a)
    sock_b, _ = await open_socket(b)
    params = await db_async(connection.get_connection_params)()
    for key in ("cursor_factory", "server_side_binding", "context"):
        params.pop(key, None)
    holder = await psycopg.AsyncConnection.connect(**params)
    try:
        await holder.execute("SELECT 1 FROM memory_timelinecounter WHERE owner_id = %s FOR UPDATE", [a.device.owner_id])
        await sock_a.send_json_to({"type": "text", "id": "from-a", "text": "hello from A"})
        await sock_b.send_json_to({"type": "text", "id": "from-b", "text": "hello from B"})
        ack_b = await receive_until(sock_b, "text.ack")
        assert ack_b["id"] == "from-b" and not ack_b["duplicate"]
        assert await sock_a.receive_nothing(timeout=0.05)  # A cannot have its number while the lock is held
    finally:
        await holder.rollback()
        await holder.close()
    ack_a = await receive_until(sock_a, "text.ack")
    assert ack_a["id"] == "from-a" and ack_a["seq"] == 1 and not ack_a["duplicate"]
    await sock_a.disconnect()
    await sock_b.disconnect()
