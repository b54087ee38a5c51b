"""A device's ACK (devices/consumers/timeline.py ``_on_ack``, devices.services ``acknowledge`` and
``record_delivery``): its query budget, and the rules the one-statement way keeps.

Counted, never timed, in autocommit as in production: the device re-check (with its owner's
account), the delivery INSERTed from the owner's entry in one statement (nothing inserted
on a repeat), and the two ledgers an ACK closes (told facts, watch notices). Before issue
14's work it was 8 statements in two database trips: the re-check on its own, then the
entry's SELECT, get_or_create's SELECT, BEGIN, INSERT, COMMIT and the two UPDATEs — which
is again SQLite's way (the embedded default takes the ORM: hand-built SQL is PostgreSQL's only).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from accounts.devices import active_device, revoke_device
from accounts.models import Device, User
from brain.models import Run
from brain.services import accept_utterance, trace_stages_update
from capabilities.models import ToldFact
from capabilities.services import acknowledge_entry as acknowledge_facts
from devices.models import Delivery
from devices.services import acknowledge, record_delivery
from schedules.models import Watch, WatchNotice
from schedules.watches import acknowledge_entry as acknowledge_notice
from schedules.watches import create_watch
from tests.conftest import new_client_id
from yimi_project.errors import YimiError

pytestmark = pytest.mark.django_db(transaction=True)  # autocommit, as in production

# The budget: raise it only with a reason in docs/decisions/2026-12-03-query-budgets.md.
ACK_QUERIES = 4  # device + owner, INSERT delivery, UPDATE told facts, UPDATE watch notices
# SQLite takes the ORM (step 3): the entry's SELECT, then get_or_create's SELECT, BEGIN, INSERT, COMMIT.
ORM_MORE = 4


def budget() -> int:
    return ACK_QUERIES + (0 if connection.vendor == "postgresql" else ORM_MORE)


def ack(device_id: Any, seq: Any, status: str = "rendered") -> tuple[Delivery, list[str]]:
    with CaptureQueriesContext(connection) as queries:
        delivery = record_delivery(active_device(device_id), seq, status)
    return delivery, [q["sql"] for q in queries.captured_queries]


def said(device: Device, text: str = "hello") -> Any:
    return accept_utterance(active_device(device.id), new_client_id(), text).entry


def test_an_owner_devices_ack_stays_within_the_query_budget_and_closes_the_told_facts(make_device: Any) -> None:
    device = make_device().device
    ack(device.id, said(device, "warm").seq)  # first use: prepared statements
    entry = said(device)
    told = ToldFact.objects.create(owner_id=device.owner_id, entry=entry, fact_id="clinic")
    delivery, issued = ack(device.id, entry.seq)
    assert len(issued) <= budget(), "\n".join(issued)
    if connection.vendor == "postgresql":  # one statement is atomic on its own
        assert not any(sql.startswith(("BEGIN", "SAVEPOINT")) for sql in issued), issued
    assert (delivery.entry_id, delivery.device_id, delivery.status) == (entry.id, device.id, "rendered")
    stored = Delivery.objects.get(id=delivery.id)
    assert (stored.entry_id, stored.device_id, stored.status, stored.at) == (entry.id, device.id, "rendered", delivery.at)
    told.refresh_from_db()
    assert told.acknowledged_at is not None


def test_an_ack_of_a_reply_that_carried_no_facts_sends_no_ledger_update(make_device: Any) -> None:
    """The runner said (``reply.done``'s ``ledgers``) that the reply carried no facts: the ACK
    is the re-check and the delivery, without the two UPDATEs that would match no row."""
    device = make_device().device
    ack(device.id, said(device, "warm").seq)  # first use: prepared statements
    entry = said(device)
    with CaptureQueriesContext(connection) as queries:
        delivery = record_delivery(active_device(device.id), entry.seq, "rendered", ledgers=False)
    issued = [q["sql"] for q in queries.captured_queries]
    assert len(issued) == budget() - 2, "\n".join(issued)
    assert not any("told" in sql or "watchnotice" in sql for sql in issued), issued
    assert Delivery.objects.get(id=delivery.id).entry_id == entry.id


def test_a_repeated_ack_returns_the_delivery_recorded_first(make_device: Any) -> None:
    device = make_device().device
    entry = said(device)
    first, _ = ack(device.id, entry.seq)
    again, _ = ack(device.id, entry.seq)
    assert (again.id, again.at) == (first.id, first.at)
    played, _ = ack(device.id, entry.seq, "played")  # another status is another delivery
    assert played.id != first.id
    assert sorted(Delivery.objects.filter(entry=entry).values_list("status", flat=True)) == ["played", "rendered"]


def test_an_ack_for_no_entry_of_the_owner_is_unknown_entry_and_stores_nothing(make_device: Any) -> None:
    device = make_device().device
    entry = said(device)
    other = make_device().device
    account = User.objects.create_user(username=f"other-{new_client_id()[:8]}", password=new_client_id())
    Device.objects.filter(id=other.id).update(owner=account)  # a device of another account: not its timeline
    for device_id, seq in ((device.id, entry.seq + 1), (other.id, entry.seq)):
        with pytest.raises(YimiError) as raised:
            ack(device_id, seq)
        assert raised.value.code == "unknown_entry"
    assert not Delivery.objects.exists()


@pytest.mark.parametrize("seq", [2**63, -(2**63) - 1, 10**30])
def test_an_ack_of_a_seq_no_64_bit_column_holds_is_an_unknown_entry(make_device: Any, seq: int) -> None:
    """No entry has it, so the answer is unknown_entry, as for any seq that does not exist
    (SQLite's driver refuses such an integer outright: it must not become internal_error)."""
    device = make_device().device
    said(device)
    with pytest.raises(YimiError) as raised:
        ack(device.id, seq)
    assert raised.value.code == "unknown_entry"
    assert not Delivery.objects.exists()


def test_an_ack_closes_exactly_the_ledgers_of_its_entry_as_the_orm_updates_did(make_device: Any) -> None:
    """``capabilities.services.acknowledge_entry`` and ``schedules.watches.acknowledge_entry``
    run statements built once, with the ORM updates' conditions: only the entry's facts not
    told before get ``acknowledged_at`` (an aware now, read back equal on every database);
    only its pending notice is delivered; only a one-time, active watch of that notice
    ends. A delivered notice costs one statement more (the watch's end), no other."""
    device = make_device().device
    owner = User.objects.get(id=device.owner_id)
    entry, other, third = said(device, "the notice"), said(device, "another"), said(device, "a third")
    earlier = timezone.now() - timedelta(days=1)
    fresh = ToldFact.objects.create(owner=owner, entry=entry, fact_id="fresh")
    told_before = ToldFact.objects.create(owner=owner, entry=entry, fact_id="before", acknowledged_at=earlier)
    elsewhere = ToldFact.objects.create(owner=owner, entry=other, fact_id="elsewhere")

    def watch(once: bool, on: Any) -> Watch:
        made = create_watch(owner, device, label="w", tool="delivery__track", arguments={}, s_from="a", s_to="b", once=once)
        WatchNotice.objects.create(watch=made, owner=owner, entry=on)
        return made

    one_time, repeating, one_time_elsewhere = watch(True, entry), watch(False, third), watch(True, other)
    before = timezone.now()
    _, issued = ack(device.id, entry.seq)
    after = timezone.now()
    assert len(issued) == budget() + 1, "\n".join(issued)  # + UPDATE the one-time watch
    for fact in (fresh, told_before, elsewhere):
        fact.refresh_from_db()
    assert fresh.acknowledged_at is not None and before <= fresh.acknowledged_at <= after
    assert fresh.acknowledged_at.utcoffset() == timedelta(0)
    assert (told_before.acknowledged_at, elsewhere.acknowledged_at) == (earlier, None)
    notice = WatchNotice.objects.get(entry=entry)
    assert notice.state == WatchNotice.State.DELIVERED
    assert notice.delivered_at is not None and before <= notice.delivered_at <= after
    assert WatchNotice.objects.get(entry=other).state == WatchNotice.State.PENDING
    active = dict(Watch.objects.values_list("id", "active"))
    assert active == {one_time.id: False, repeating.id: True, one_time_elsewhere.id: True}
    # again: nothing left to close, nothing rewritten; the counts are the rows changed
    assert (acknowledge_facts(entry.id), acknowledge_notice(entry.id)) == (0, 0)
    assert WatchNotice.objects.get(entry=entry).delivered_at == notice.delivered_at
    assert (acknowledge_facts(other.id), acknowledge_notice(other.id)) == (1, 1)
    assert not Watch.objects.get(id=one_time_elsewhere.id).active
    assert acknowledge_notice(third.id) == 1 and Watch.objects.get(id=repeating.id).active  # a repeating watch goes on
    assert WatchNotice.objects.get(entry=third).state == WatchNotice.State.DELIVERED


def acknowledged(device_id: Any, seq: Any, status: Any = "rendered", **kwargs: Any) -> tuple[Device, list[str]]:
    with CaptureQueriesContext(connection) as queries:
        device = acknowledge(device_id, seq, status, **kwargs)
    return device, [q["sql"] for q in queries.captured_queries]


def test_the_usual_ack_with_the_trace_stamp_is_one_statement_on_postgresql(make_device: Any) -> None:
    """The consumer's ACK of a reply.done it sent (no facts told): the re-check, the delivery
    and the trace's stamp. One statement on PostgreSQL; on SQLite (the embedded default) the
    ORM's: the ACK without ledgers (``budget() - 2``, the re-check included) and the stamp's
    BEGIN, read, UPDATE, COMMIT."""
    device = make_device().device
    acknowledged(device.id, said(device, "warm").seq)  # first use: prepared statements
    accepted = accept_utterance(active_device(device.id), new_client_id(), "hello")
    stamp = {"done_sent": 1.0, "ack": 2.0}
    back, issued = acknowledged(device.id, accepted.entry.seq, ledgers=False, rider=trace_stages_update(accepted.run_id, stamp))
    assert len(issued) == (1 if connection.vendor == "postgresql" else budget() - 2 + 4), "\n".join(issued)
    assert (back.id, back.owner.id) == (device.id, device.owner_id)
    assert Delivery.objects.filter(entry=accepted.entry, device_id=device.id, status="rendered").count() == 1
    trace = Run.objects.get(id=accepted.run_id).trace
    assert (trace["done_sent"], trace["ack"]) == (1.0, 2.0) and "admitted" in trace  # merged, not replaced


def test_an_ack_with_ledgers_closes_them_after_the_one_statement(make_device: Any) -> None:
    device = make_device().device
    acknowledged(device.id, said(device, "warm").seq)
    entry = said(device)
    told = ToldFact.objects.create(owner_id=device.owner_id, entry=entry, fact_id="clinic")
    _, issued = acknowledged(device.id, entry.seq)
    assert len(issued) == (3 if connection.vendor == "postgresql" else budget()), "\n".join(issued)
    told.refresh_from_db()
    assert told.acknowledged_at is not None


def test_a_revoked_or_unknown_devices_ack_writes_nothing_not_even_the_riders_stamp(make_device: Any) -> None:
    device = make_device().device
    accepted = accept_utterance(active_device(device.id), new_client_id(), "hello")
    revoke_device(device)
    before = Run.objects.get(id=accepted.run_id).trace
    rider = trace_stages_update(accepted.run_id, {"ack": 9.0})
    for device_id, code in ((device.id, "device_revoked"), ("00000000-0000-0000-0000-000000000000", "not_authenticated")):
        with pytest.raises(YimiError) as raised:
            acknowledge(device_id, accepted.entry.seq, "rendered", rider=rider)
        assert raised.value.code == code
    assert not Delivery.objects.exists()
    assert Run.objects.get(id=accepted.run_id).trace == before


def test_a_guest_a_repeat_and_a_missing_entry_are_answered_as_record_delivery_answers(make_device: Any) -> None:
    """The statement inserts only for an owner device; what it did not insert goes the
    general way: a guest ACKs only its own exchange, a repeat is a no-op, a missing entry
    is unknown_entry. The rider's stamp is written only with an ACK that is taken."""
    owner_device = make_device().device
    guest = make_device("mac", guest=True).device
    own = accept_utterance(active_device(guest.id), new_client_id(), "a guest's question")
    owners = said(owner_device, "the owner's")
    acknowledge(guest.id, own.entry.seq, "rendered", rider=trace_stages_update(own.run_id, {"ack": 3.0}))
    assert Delivery.objects.filter(entry=own.entry, device_id=guest.id).count() == 1
    assert Run.objects.get(id=own.run_id).trace["ack"] == 3.0
    owners_run = Run.objects.get(inbound=owners)
    with pytest.raises(YimiError) as raised:  # the owner's entry: not the guest's to see
        acknowledge(guest.id, owners.seq, "rendered", rider=trace_stages_update(owners_run.id, {"ack": 4.0}))
    assert raised.value.code == "unknown_entry"
    assert "ack" not in Run.objects.get(id=owners_run.id).trace
    acknowledge(owner_device.id, owners.seq, "rendered")
    _, issued = acknowledged(owner_device.id, owners.seq)  # a repeat: nothing new
    assert Delivery.objects.filter(entry=owners, device_id=owner_device.id).count() == 1
    first = 1 if connection.vendor == "postgresql" else 0  # SQLite: get_or_create finds it, inserts nothing
    assert sum("INSERT INTO" in sql for sql in issued) == first, issued  # the first delivery's INSERT, not tried twice
    with pytest.raises(YimiError) as raised:
        acknowledge(owner_device.id, owners.seq + 100, "rendered", rider=trace_stages_update(owners_run.id, {"ack": 5.0}))
    assert raised.value.code == "unknown_entry"
    assert "ack" not in Run.objects.get(id=owners_run.id).trace
    acknowledge(owner_device.id, owners.seq, "played", rider=trace_stages_update(owners_run.id, {"ack": 6.0}))
    assert Run.objects.get(id=owners_run.id).trace["ack"] == 6.0  # a taken ACK (another status) stamps


@pytest.mark.parametrize(("seq", "status"), [("7", "rendered"), (True, "rendered"), (1, "read"), (2**63, "rendered")])
def test_an_invalid_ack_is_refused_as_before_and_writes_nothing(make_device: Any, seq: Any, status: Any) -> None:
    device = make_device().device
    said(device)
    with pytest.raises(YimiError) as raised:
        acknowledge(device.id, seq, status)
    assert raised.value.code == ("unknown_entry" if seq == 2**63 else "invalid_frame")
    assert not Delivery.objects.exists()
